"""The OpenAPI schema says what the server does: schemathesis generates requests from
``/openapi.json`` (valid ones and not), sends them to a live server on 127.0.0.1 and checks
every answer against the schema: no 5xx, only declared status codes and content types, bodies
of the declared shape. A bounded number of examples per route."""

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="a test dependency")
from hypothesis import HealthCheck, settings  # noqa: E402  (after the skip)

from tests.serve.conftest import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def api_schema(served):
    from vaswani.serve import create_app

    with LiveServer(create_app(served)) as server:
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def whole_numbers_as_integers(case):
    """JSON Schema counts 10.0 as an integer; the server, as OpenAI's API, takes a whole
    number only as written without a fraction (``max_tokens: 10.0``, a token id ``504.0``
    are refused: tests/serve/test_app.py): the generated bodies write them as clients do.
    The largest integer a field takes (a seed's 2**63 - 1) is a float to the generator, and
    comes out as that float's 16 digits (9223372036854776000): it is written back as the
    integer it stands for."""
    def fix(value):
        if isinstance(value, float | int) and not isinstance(value, bool) and \
                float(value).is_integer() and abs(value) < 2**63 + 2**10:
            return max(-(2**63 - 1), min(2**63 - 1, int(value)))
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return [fix(v) for v in value] if isinstance(value, list) else value
    case.body = fix(case.body)
    return case


def test_every_route_answers_as_its_schema_says(api_schema):
    from hypothesis import given

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 9  # /health, /metrics and the /v1 routes
    for operation in operations:
        @given(case=operation.as_strategy().map(whole_numbers_as_integers))
        @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(timeout=60)

        check()
