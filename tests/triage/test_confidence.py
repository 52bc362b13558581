"""Confidence comes from the evidence (titan.triage.confidence): each factor moves it the documented way."""

from __future__ import annotations

from pathlib import Path

from titan.triage import triage

OOM = "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
WD = ("[rank{r}]:[E1130 09:10:00.000 ProcessGroupNCCL.cpp:1] [Rank {r}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600100 milliseconds "
      "before timing out.\n")


def _v(tmp: Path, name: str, files: dict[str, str]):  # type: ignore[no-untyped-def]
    d = tmp / name
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return triage([d])


def test_corroboration_and_explained_consequences_raise_confidence_and_say_so(tmp_path: Path) -> None:
    alone = _v(tmp_path, "alone", {"r1.log": OOM.format(r=1)})
    story = _v(tmp_path, "story", {"r1.log": OOM.format(r=1) + "[rank1]: RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED "
                                                               "when calling `cublasCreate(handle)`\n",
                                   "r0.log": WD.format(r=0), "r2.log": WD.format(r=2)})
    assert alone.cls == story.cls == "oom"
    assert story.confidence > alone.confidence, (alone.confidence, story.confidence, story.steps[-1])
    assert "corroborated" in story.steps[-1] and "later consequence" in story.steps[-1], story.steps[-1]


def test_a_rival_cause_of_another_class_lowers_confidence(tmp_path: Path) -> None:
    alone = _v(tmp_path, "alone", {"r1.log": OOM.format(r=1)})
    rival = _v(tmp_path, "rival", {"r1.log": OOM.format(r=1),
                                   "r2.log": "[rank2]: OSError: [Errno 28] No space left on device\n"})
    assert rival.confidence < alone.confidence, (alone.confidence, rival.confidence, rival.steps[-1])
    assert "rival causes" in rival.steps[-1], rival.steps[-1]


def test_a_generic_exception_is_less_confident_than_a_specific_message(tmp_path: Path) -> None:
    generic = _v(tmp_path, "generic", {"a.log": "RuntimeError: something went wrong in the model\n"})
    specific = _v(tmp_path, "specific", {"a.log": "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"})
    assert generic.confidence < 0.6 <= 0.8 <= specific.confidence, (generic.confidence, specific.confidence)


def test_a_culprit_only_implied_by_absence_is_less_confident_than_one_whose_lines_are_there(tmp_path: Path) -> None:
    implied = _v(tmp_path, "implied", {"a.log": WD.format(r=1) + WD.format(r=2)})
    seen = _v(tmp_path, "seen", {"a.log": WD.format(r=1) + WD.format(r=2), "rank0.log": "[rank0]: step 5 loss 1.0\n"})
    assert implied.culprit["rank"] == seen.culprit["rank"] == 0, (implied.culprit, seen.culprit)
    assert implied.confidence < seen.confidence, (implied.confidence, seen.confidence)
