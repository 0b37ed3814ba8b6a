"""The entry point's resume check decides what a run resumes as Megatron's load_checkpoint
does (megatron-core 0.16-0.19), one test per case: it refused valid runs (a release
checkpoint, --finetune) and passed runs that then failed on the optimizer state
(--ckpt-step with no tracker file, a non-persistent checkpoint)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_burst.megatron import environment
from megatron_burst.megatron.resume import optimizer_state_source

DEFAULTS = dict(load=None, finetune=False, no_load_optim=False, ckpt_step=None,
                pretrained_checkpoint=None, non_persistent_ckpt_type=None,
                non_persistent_global_ckpt_dir=None, non_persistent_local_ckpt_dir=None,
                use_distributed_optimizer=True)


def _args(**given) -> SimpleNamespace:
    return SimpleNamespace(**{**DEFAULTS, **given})


def _tracker(folder, text: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(text + "\n")
    return folder


def test_no_checkpoint_yet_loads_nothing(tmp_path):
    assert optimizer_state_source(_args(load=str(tmp_path))) is None
    assert optimizer_state_source(_args()) is None


def test_a_saved_iteration_loads_its_optimizer_state(tmp_path):
    _tracker(tmp_path, "40")
    assert optimizer_state_source(_args(load=str(tmp_path))) == f"{tmp_path} at iteration 40"


def test_a_release_checkpoint_holds_no_optimizer_state(tmp_path):
    _tracker(tmp_path, "release")
    assert optimizer_state_source(_args(load=str(tmp_path))) is None
    assert optimizer_state_source(_args(load=str(tmp_path), ckpt_step=5)) is None


def test_finetune_loads_no_optimizer_state(tmp_path):
    _tracker(tmp_path, "40")
    assert optimizer_state_source(_args(load=str(tmp_path), finetune=True)) is None


def test_no_load_optim(tmp_path):
    _tracker(tmp_path, "40")
    assert optimizer_state_source(_args(load=str(tmp_path), no_load_optim=True)) is None


def test_ckpt_step_loads_without_a_tracker_file(tmp_path):
    assert optimizer_state_source(_args(load=str(tmp_path), ckpt_step=7)) == (
        f"{tmp_path} at iteration 7")
    _tracker(tmp_path, "40")  # and it wins over the tracker's iteration
    assert optimizer_state_source(_args(load=str(tmp_path), ckpt_step=7)).endswith(" 7")


def test_a_non_persistent_checkpoint_is_loaded(tmp_path):
    _tracker(tmp_path / "non_persistent", "50")
    args = _args(load=str(tmp_path), non_persistent_ckpt_type="global")
    assert optimizer_state_source(args) == (
        f"the non-persistent checkpoint in {tmp_path / 'non_persistent'}")
    _tracker(tmp_path, "40")  # older persistent: the non-persistent one still wins
    assert "non-persistent" in optimizer_state_source(args)
    _tracker(tmp_path, "60")  # newer persistent: that one
    assert optimizer_state_source(args) == f"{tmp_path} at iteration 60"
    # Without --non-persistent-ckpt-type Megatron does not look there.
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert optimizer_state_source(_args(load=str(tmp_path))) is None


def test_a_non_persistent_checkpoint_in_its_own_folder(tmp_path):
    _tracker(tmp_path / "np", "3")
    args = _args(load=str(tmp_path / "ckpt"), non_persistent_ckpt_type="global",
                 non_persistent_global_ckpt_dir=str(tmp_path / "np"))
    assert optimizer_state_source(args) == f"the non-persistent checkpoint in {tmp_path / 'np'}"


def test_a_local_non_persistent_checkpoint(tmp_path):
    args = _args(load=str(tmp_path), non_persistent_ckpt_type="local",
                 non_persistent_local_ckpt_dir=str(tmp_path / "local"))
    assert optimizer_state_source(args) is None
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "rank0").write_text("")
    assert "non-persistent" in optimizer_state_source(args)


def test_pretrained_checkpoint_is_a_finetune_unless_load_has_one(tmp_path):
    _tracker(tmp_path / "pretrained", "100")
    args = _args(load=str(tmp_path / "run"), pretrained_checkpoint=str(tmp_path / "pretrained"))
    assert optimizer_state_source(args) is None  # loaded as --finetune: no optimizer state
    _tracker(tmp_path / "run", "20")  # the run's own checkpoint: resumed with its state
    assert optimizer_state_source(args) == f"{tmp_path / 'run'} at iteration 20"


@pytest.mark.parametrize("tracker, extra, refused", [
    ("40", {}, True),
    ("release", {}, False),
    ("40", {"finetune": True}, False),
    (None, {"ckpt_step": 3}, True),
])
def test_the_entry_point_refuses_only_runs_that_load_the_state(tmp_path, monkeypatch, tracker,
                                                               extra, refused):
    from megatron_burst.megatron.run_checks import refuse_failing_resume as _refuse_failing_resume

    monkeypatch.setattr(environment, "fused_adam_source", lambda: None)
    if tracker:
        _tracker(tmp_path, tracker)
    args = _args(load=str(tmp_path), **extra)
    if not refused:
        _refuse_failing_resume(args)
        return
    with pytest.raises(ValueError) as error:
        _refuse_failing_resume(args)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "--use-distributed-optimizer" in message and "--no-load-optim" in message
    monkeypatch.setattr(environment, "fused_adam_source", lambda: "apex")
    _refuse_failing_resume(args)  # with a fused Adam it resumes
