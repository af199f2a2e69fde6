import math

import pytest

from vaswani.training.schedules import lr_factor


def noam(step, warmup):
    return lr_factor(step, schedule="noam", warmup=warmup, max_steps=10_000)


def test_noam_clamps_step_zero_peaks_at_warmup_and_decays_as_inverse_sqrt():
    assert noam(0, 100) == noam(1, 100) == pytest.approx(0.01)  # 0 ** -0.5 avoided
    assert noam(50, 100) == pytest.approx(0.5)  # linear warmup
    assert noam(100, 100) == pytest.approx(1.0)  # peak
    assert noam(400, 100) == pytest.approx(0.5)  # sqrt(100 / 400)
    # The paper's formula, rescaled so that the peak is 1:
    d_model, warmup, step = 512, 4000, 12_345
    paper = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    peak = d_model ** -0.5 * warmup ** -0.5
    assert noam(step, warmup) == pytest.approx(paper / peak)


def test_cosine_warmup_then_half_cosine_to_the_floor():
    f = lambda s: lr_factor(s, schedule="cosine", warmup=10, max_steps=110, min_ratio=0.1)  # noqa: E731
    assert f(0) == pytest.approx(0.1)  # (0 + 1) / 10
    assert f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway
    assert f(110) == pytest.approx(0.1)
    assert f(85) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75)))


def test_constant_and_unknown():
    assert lr_factor(4, schedule="constant", warmup=10, max_steps=20) == pytest.approx(0.5)
    assert lr_factor(15, schedule="constant", warmup=10, max_steps=20) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        lr_factor(1, schedule="linear", warmup=1, max_steps=2)


def test_wsd_warms_up_holds_then_falls_in_a_straight_line_to_the_floor():
    """100 steps, the last 30% decayed: 1 until step 70, then linear to the floor at 100."""
    f = lambda s: lr_factor(s, schedule="wsd", warmup=10, max_steps=100,  # noqa: E731
                            min_ratio=0.1, cooldown=0.3)
    assert f(4) == pytest.approx(0.5)  # the warm-up
    assert f(10) == f(50) == f(70) == 1.0
    assert f(85) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway down
    assert f(100) == pytest.approx(0.1) and f(120) == pytest.approx(0.1)


def test_a_cooldown_outside_zero_to_one_is_refused():
    from vaswani.config import TrainConfig

    TrainConfig(schedule="wsd", cooldown=1.0).validate()
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"cooldown \(.*\) must be in \(0, 1\]"):
            TrainConfig(schedule="wsd", cooldown=bad).validate()


def test_a_run_that_ends_inside_its_warmup_is_told_its_rate_never_reaches_lr(capsys):
    """The default warmup (100 steps) in a 30-step fine-tune: the rate climbs the whole run
    and peaks at 30% of lr. Said, with the factor the last step really gets; a warmup
    shorter than the run, or none, says nothing."""
    from vaswani.config import TrainConfig
    from vaswani.training.schedules import check_schedule

    def said(**kw) -> str:
        check_schedule(TrainConfig(lr=2e-3, **kw).replace(schedule_steps=kw["max_steps"]))
        return capsys.readouterr().err

    message = said(max_steps=30, warmup=100)
    assert "train.warmup (100) is not shorter than max_steps (30)" in message
    assert "reaches 30% of lr (0.002)" in message
    assert lr_factor(29, schedule="cosine", warmup=100, max_steps=30) == pytest.approx(0.3)
    assert said(max_steps=30, warmup=5) == said(max_steps=30, warmup=0) == ""


def test_only_the_process_that_says_prints_the_schedules_warnings(tmp_path, capsys):
    """Every rank of a multi-process run reads the config; rank 0 alone prints what its
    schedule says (train.py passes ``say=launch.rank == 0``), and every rank refuses a
    schedule that cannot run."""
    from vaswani.config import TrainConfig
    from vaswani.training.schedules import check_schedule
    from vaswani.training.train import configure

    config = tmp_path / "lm.toml"
    config.write_text('[model]\narch = "decoder"\n[data]\ndataset = "tiny-shakespeare"\n'
                      '[train]\nmax_steps = 30\nwarmup = 100\n')
    configure(str(config), [], say=False)
    assert capsys.readouterr().err == ""
    configure(str(config), [])
    assert "train.warmup (100) is not shorter than max_steps (30)" in capsys.readouterr().err
    past = TrainConfig(max_steps=300, schedule="cosine", min_lr=1e-5, warmup=5
                       ).replace(schedule_steps=200)
    check_schedule(past, say=False)
    assert capsys.readouterr().err == ""
    check_schedule(past)
    assert "steps 201-300 run after the end" in capsys.readouterr().err
    with pytest.raises(ValueError, match="min_lr"):
        check_schedule(past.replace(min_lr=0.0), say=False)
