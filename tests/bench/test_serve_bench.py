"""benchmarks/serve.py's streaming part against a real ``vaswani serve`` of a tiny LM: every
client gets its whole completion, and the server runs on the device asked for (timing is
never asserted)."""

from benchmarks.serve import Server, stream


def test_streaming_clients_each_get_every_token(small_runs):
    run_dir, _ = small_runs["decoder"]
    with Server(run_dir, "lm", max_batch=4, device="cpu") as server:
        assert "--device" in server.process.args and "cpu" in server.process.args
        out = stream(server.url, clients=3, tokens=6)
    assert out["tokens"] == 18 and out["tokens_per_s"] > 0 and out["first_token_s"] > 0
