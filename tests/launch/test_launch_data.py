"""`megatron-burst data` and the CPU run on real text: corpus -> tokens -> Megatron's files ->
megatron-core's reader -> training windows -> a CPU training run."""
from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the data path needs the `data` extra: tokenizers")
pytest.importorskip("megatron.core")

from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402

from megatron_burst.cli.parser import main  # noqa: E402
from megatron_burst.launch.config.schema import ConfigError, config_from_dict  # noqa: E402
from megatron_burst.launch.data.dataset import (  # noqa: E402
    DataError, load_tokenizer, tokenize_jsonl, write_dataset)
from megatron_burst.launch.data.sample import EOD_TOKEN, write_sample  # noqa: E402
from megatron_burst.tools.cpu_data import TextWindows, check_text_config  # noqa: E402
from megatron_burst.tools.cpu_run import run_cpu  # noqa: E402

from .conftest import REPO  # noqa: E402

TEXT_CONFIG = REPO / "configs" / "tiny-llama-cpu-text.yaml"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The offline sample, made once for this module: corpus, tokenizer, dataset."""
    return write_sample(tmp_path_factory.mktemp("sample"))


@pytest.fixture
def tokenizer(sample):
    return load_tokenizer(sample.dataset.tokenizer.path)


def _write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_corpus_round_trips_through_megatron_reader(tmp_path, tokenizer):
    texts = ["The quick brown fox.", "", "Naïve café: 3 documents,\nmany lines.", "  "]
    corpus = tmp_path / "corpus.jsonl"
    _write_jsonl(corpus, [{"text": t, "id": i} for i, t in enumerate(texts)])
    (tmp_path / "out").mkdir()
    summary = tokenize_jsonl(corpus, tokenizer.path, str(tmp_path / "out" / "docs"))
    dataset = IndexedDataset(str(tmp_path / "out" / "docs"))
    expected = [ids + [tokenizer.eod_id] for ids in tokenizer.encode_batch(texts) if ids]
    # "" has no token and is skipped; "  " is a token of its own and is kept.
    assert (summary.documents, summary.skipped_empty) == (3, 1) == (len(dataset), 1)
    assert [list(dataset[i]) for i in range(len(dataset))] == expected
    assert list(dataset.document_indices) == [0, 1, 2, 3]  # one sequence per document
    assert summary.tokens == sum(map(len, expected)) == int(dataset.sequence_lengths.sum())
    assert dataset[0].dtype == np.uint16  # Megatron's choice below 65,500 tokens
    # EOD ends every document and appears nowhere else.
    stream = np.concatenate([dataset[i] for i in range(len(dataset))])
    ends = np.cumsum(dataset.sequence_lengths) - 1
    assert np.flatnonzero(stream == tokenizer.eod_id).tolist() == ends.tolist()


def test_sample_is_consistent(sample):
    lines = sample.corpus.read_text().splitlines()
    assert len(lines) == sample.dataset.documents > 300
    tokenizer = sample.dataset.tokenizer
    assert tokenizer.eod_token == EOD_TOKEN and tokenizer.vocab_size == 1024
    config = json.loads((sample.corpus.parent / "tokenizer" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == EOD_TOKEN
    dataset = IndexedDataset(sample.dataset.prefix)
    assert int(max(dataset[i].max() for i in range(len(dataset)))) < tokenizer.vocab_size
    assert all(dataset[i][-1] == tokenizer.eod_id for i in range(len(dataset)))


def test_autotokenizer_reads_the_sample_tokenizer_alike(sample, tokenizer):
    """Megatron's HuggingFaceTokenizer loads tokenizers through transformers' AutoTokenizer."""
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(tokenizer.path, local_files_only=True)
    text = "Return the value of the attribute."
    assert auto(text).input_ids == tokenizer.encode_batch([text])[0]
    assert (auto.eos_token_id, len(auto)) == (tokenizer.eod_id, tokenizer.vocab_size)


@pytest.mark.parametrize("lines, message", [
    (['{"text": "ok"}', "{not json"], "line 2 column 2: not JSON: Expecting property name"),
    (['{"body": "no text key"}'], "line 1: no 'text' key (choose the key with --json-key)"),
    (['{"text": 3}'], "line 1: 'text' is a int, not text"),
    ([], "no documents"),
])
def test_bad_corpus_is_named(tmp_path, tokenizer, lines, message):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(DataError, match=re.escape(message)):
        tokenize_jsonl(corpus, tokenizer.path, str(tmp_path / "d"))
    assert not (tmp_path / "d.bin").exists()


def test_tokenizer_without_eos_is_refused(tmp_path, sample):
    folder = tmp_path / "tok"
    folder.mkdir()
    source = sample.corpus.parent / "tokenizer"
    (folder / "tokenizer.json").write_text((source / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(DataError, match="no eos_token in tokenizer_config.json"):
        load_tokenizer(folder)


def test_data_command_errors_are_one_line(tmp_path, sample, capsys):
    tok = str(sample.corpus.parent / "tokenizer")
    cases = [
        (["data", str(tmp_path / "none.jsonl"), "--tokenizer", tok, "-o", str(tmp_path / "p")],
         "none.jsonl: no such file"),
        (["data", str(sample.corpus), "--tokenizer", tok, "-o", str(tmp_path / "p.bin")],
         "--output-prefix"),
        (["data", str(sample.corpus), "-o", str(tmp_path / "p")], "--tokenizer is required"),
        (["data", str(sample.corpus), "--tokenizer", str(tmp_path), "-o", "p"],
         "no tokenizer.json"),
        (["data", "--sample-corpus", str(tmp_path), "--tokenizer", tok], "drop --tokenizer"),
        (["data", "--sample-corpus", str(tmp_path), "--vocab-size", "100"], "--vocab-size 100"),
    ]
    for argv, named in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and named in err, err


# ---------------------------------------------------------------------------- the CPU run

def _text_config(sample, **training):
    """The shipped text config, pointed at this module's sample."""
    import yaml

    raw = yaml.safe_load(TEXT_CONFIG.read_text())
    raw["data"].update(data_path=sample.dataset.prefix,
                       tokenizer_model=sample.dataset.tokenizer.path)
    raw["training"].update(training)
    return raw


def test_windows_read_the_stream_across_documents(sample):
    cfg = config_from_dict(_text_config(sample))
    windows = TextWindows.open(cfg)
    dataset = windows.dataset
    stream = np.concatenate([dataset[i] for i in range(len(dataset))])
    seq = cfg.model.seq_length
    assert windows.windows == (len(stream) - 1) // seq and windows.tokens == len(stream)
    for w in (0, 1, windows.windows - 1):
        assert windows.read(w * seq, seq + 1).tolist() == stream[w * seq:w * seq + seq + 1].tolist()
    batch = windows.batch(3)
    assert batch["tokens"].shape == (cfg.training.global_batch_size, seq)
    assert (batch["labels"][:, :-1] == batch["tokens"][:, 1:]).all()
    assert all((windows.batch(3)[k] == v).all() for k, v in batch.items())  # same every time
    # One pass visits every window once.
    per_pass = windows.windows // cfg.training.global_batch_size
    firsts = {tuple(windows.batch(it)["tokens"][r, :8].tolist())
              for it in range(per_pass) for r in range(cfg.training.global_batch_size)}
    assert len(firsts) == per_pass * cfg.training.global_batch_size


@pytest.mark.parametrize("change, key", [
    (lambda raw: raw["model"].update(seq_length=400_000), "data.data_path"),  # longer than it
    (lambda raw: raw["model"].update(vocab_size=512), "model.vocab_size"),
    (lambda raw: raw["data"].update(data_path="/no/such/prefix"), "data.data_path"),
    (lambda raw: raw["data"].update(tokenizer_model="/no/such/tokenizer"),
     "data.tokenizer_model"),
    (lambda raw: raw["data"].update(data_path="0.5 a 0.5 b"), "data.data_path"),
])
def test_text_run_checks_name_the_key(sample, change, key):
    raw = copy.deepcopy(_text_config(sample))
    change(raw)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        TextWindows.open(config_from_dict(raw))


def test_dataset_of_another_tokenizer_is_refused(sample, tmp_path):
    other = load_tokenizer(sample.dataset.tokenizer.path)
    shifted = type(other)(other.path, other.vocab_size, other.eod_id + 1, "x",
                          other.encode_batch)
    write_dataset(["Some text that is long enough. " * 200], shifted, str(tmp_path / "other"))
    raw = _text_config(sample)
    raw["data"]["data_path"] = str(tmp_path / "other")
    with pytest.raises(ConfigError, match="'data.tokenizer_model'.*another tokenizer"):
        TextWindows.open(config_from_dict(raw))


def test_cpu_run_on_real_text_learns_and_matches_cp1(sample, warm_cpu_ranks):
    """End to end on 2 + 1 ranks: the sample's text, CP=2 against CP=1, loss falling."""
    raw = _text_config(sample, lr_warmup_iters=2, micro_batch_size=4, global_batch_size=4,
                       lr=1e-2, min_lr=1e-3)  # a fast start: six steps must show learning
    raw["parallel"].update(tensor=1, context=2)
    raw["cluster"].update(gpus_per_node=2)
    cfg = config_from_dict(raw)
    check_text_config(cfg)
    lines: list[str] = []
    main_run, ref = run_cpu(cfg, iters=6, echo=lines.append)
    assert main_run.losses[0] == pytest.approx(np.log(1024), abs=0.1)  # untrained: uniform
    assert main_run.losses[-1] < main_run.losses[0] - 0.3
    assert max(abs(a - b) for a, b in zip(main_run.losses, ref.losses)) < 1e-4
    assert "text from" in lines[0]
