"""The translation task's validation metric decodes on the inference engine, as `vaswani
translate` does, and scores what the written-out reference decoder would have produced."""

import torch

import vaswani
from tests.conftest import DEVICE
from vaswani import rundir
from vaswani.data.batching import pad
from vaswani.evaluation.metrics import bleu_chrf, exact_match
from vaswani.generation import greedy_decode
from vaswani.tasks import task_for


def test_the_metric_decodes_on_the_engine_what_the_reference_decoder_decodes(copy_run,
                                                                             tmp_path):
    run = vaswani.load(copy_run[0], device=str(DEVICE))
    task = task_for(run.config)
    source, target, _ = rundir.read_tokenizers(copy_run[0])
    data = task.load(tmp_path / "cache", (source, target), progress=False)
    n = 40
    got = task.metric(run.model, data, None, n, DEVICE)

    pairs, d = data.raw_valid[:n], run.config.decode
    sources = [data.valid[i][0] for i in range(len(pairs))]
    out = greedy_decode(run.model, pad(sources, task.pad_id).to(DEVICE), bos_id=target.bos_id,
                        eos_id=target.eos_id, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    hyps, refs = [target.decode(ids) for ids in out], [t for _, t in pairs]
    scores = bleu_chrf(hyps, refs)
    assert len(pairs) == n
    assert got == {"exact_match": exact_match(hyps, refs), "bleu": scores["bleu"],
                   "chrf": scores["chrf"]}
    if DEVICE.type == "cpu":  # a bf16 run: under autocast (100 > 64 rows: rows join later)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert set(task.metric(run.model, data, None, 100, DEVICE)) == set(got)
