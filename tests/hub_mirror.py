"""A stand-in Hugging Face mirror for the full-scale tasks, for tests.

For every model and dataset that a full-scale task config names (and every dataset
lm-eval's task definitions load for the evaluations it names), `build_mirror` writes a
tiny stand-in under the same repository name, of the same architecture family and
tokenizer type, with the same dataset configs and splits, laid out as the libraries
lay out their caches after a real download:

- models: `$HF_HOME/hub/models--owner--name/{blobs/<sha256>, snapshots/<rev>/<file> -> blob,
  refs/main}` (huggingface_hub's cache, read by `snapshot_download` and `from_pretrained`);
- datasets: the raw files in `$HF_HOME/hub/datasets--owner--name/...` (parquet per config
  and split, README.md with the `configs:` metadata, as on the hub) and the prepared
  Arrow tables in `$HF_HOME/datasets/owner___name/<config>/0.0.0/<rev>/`, which is what
  `datasets.load_dataset` reads with HF_DATASETS_OFFLINE=1.

The datasets' Arrow tables are written by `datasets` itself, from a local copy of the
repository's files, so their layout is the library's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"  # one fake commit for every stand-in repository

WORDS = ("the a cat dog bird sees likes runs near under big small red blue one two three "
         "is are was were not and or but which who if then theorem proof nat real").split()  # fmt: skip


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


# ---- models ---------------------------------------------------------------------------
# repo id -> (family, tokenizer kind); families are built by `_model`, tokenizers by `_tokenizer`.
MODELS: dict[str, tuple] = {
    "gpt2": ("gpt2", "byte_level"),
    "distilgpt2": ("gpt2", "byte_level"),
    "microsoft/phi-2": ("phi", "codegen"),
    "mistralai/Mistral-7B-v0.1": ("mistral", "llama"),
    "meta-llama/Llama-2-7b-hf": ("llama", "llama"),
    "facebook/bart-base": ("bart", "bart"),
}
# Stand-in LoRA adapters of the Llama-2 stand-in (the full llm_merging config asks the user to name them).
ADAPTERS = ["mlrb-standin/llama-2-7b-lora-alpha", "mlrb-standin/llama-2-7b-lora-beta"]


def _tokenizer(kind: str, out: Path) -> int:
    """Train a tiny tokenizer of the family's kind and save it with its transformers class
    (GPT-2's byte-level BPE for gpt2/phi/bart; a Llama-style BPE over '▁' for llama/mistral)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [sentence(rng, 12) for _ in range(300)] + ["0123456789 +-*/=:()[]{}<>,.;'\"?!_"]
    if kind == "llama":
        from transformers import LlamaTokenizerFast

        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])  # fmt: skip
        specials = ["<unk>", "<s>", "</s>"]
        byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials + byte_tokens,
                                                             show_progress=False))  # fmt: skip
        fast = LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  add_bos_token=True, add_eos_token=False)  # fmt: skip
    else:
        from transformers import BartTokenizerFast, CodeGenTokenizerFast, GPT2TokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] if kind == "bart" else ["<|endoftext|>"]
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))  # fmt: skip
        if kind == "bart":
            fast = BartTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                     pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")  # fmt: skip
        else:
            cls = CodeGenTokenizerFast if kind == "codegen" else GPT2TokenizerFast
            fast = cls(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                       unk_token="<|endoftext|>")  # fmt: skip
    fast.save_pretrained(out)
    return len(fast)


def _model(family: str, vocab: int, out: Path) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    small = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    if family == "gpt2":
        model = tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
            )
        )  # <|endoftext|>
    elif family == "phi":
        model = tf.PhiForCausalLM(tf.PhiConfig(**{**small, "num_key_value_heads": 4})).to(torch.float16)
    elif family == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**small, sliding_window=None))
    elif family == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**small))
    elif family == "bart":
        model = tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256))  # fmt: skip
    else:
        raise ValueError(f"no stand-in for the model family {family}")
    model.save_pretrained(out)


def _adapter(base_dir: Path, out: Path, seed: int) -> None:
    """A peft LoRA adapter (r=4 on q/v) of the Llama stand-in, with non-zero updates."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))  # fmt: skip
    peft_model.save_pretrained(out)


def _publish(hub: Path, kind: str, repo: str, files: Path) -> None:
    """Lay `files` out as huggingface_hub's cache does: blobs, a snapshot of links, refs/main."""
    root = hub / f"{kind}s--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    for path in sorted(p for p in files.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)


def add_model(hf_home: Path, repo: str) -> None:
    family, tokenizer_kind = MODELS[repo]
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp)
        vocab = _tokenizer(tokenizer_kind, files)
        _model(family, vocab, files)
        _publish(hf_home / "hub", "model", repo, files)


def add_adapters(hf_home: Path) -> None:
    base = hf_home / "hub" / "models--meta-llama--Llama-2-7b-hf" / "snapshots" / REVISION
    for seed, repo in enumerate(ADAPTERS):
        with tempfile.TemporaryDirectory() as tmp:
            _adapter(base, Path(tmp), seed)
            _publish(hf_home / "hub", "model", repo, Path(tmp))


# ---- datasets -------------------------------------------------------------------------
def _rows(fields: str, n: int, rng: random.Random) -> list[dict]:
    """Rows of the shape each dataset has (the fields the tasks and lm-eval read)."""
    out = []
    for i in range(n):
        s = lambda k=8: sentence(rng, k)  # noqa: E731
        row = {
            "babylm": lambda i=i, s=s: {"filename": f"file{i}.train", "content": "\n".join(s() for _ in range(20))},
            "text": lambda i=i, s=s: {"text": " ".join(s() for _ in range(10))},
            "alpaca": lambda i=i, s=s: {"output": s(), "input": s(), "instruction": s()},
            "dolly": lambda i=i, s=s: {"instruction": s(), "context": s(), "response": s(), "category": "open_qa"},
            "autoformalization": lambda i=i, s=s: {
                "name": f"problem_{i}",
                "informal_statement": s(),
                "informal_proof": s(),
                "formal_proof": f"theorem problem_{i} : (2 : ℕ) + {i} = {i} + 2 := by simp",
            },
            "mmlu": lambda i=i, s=s: {
                "question": s(),
                "subject": "",
                "choices": [s(3) for _ in range(4)],
                "answer": rng.randrange(4),
            },
            "blimp": lambda i=i, s=s: {
                "sentence_good": s(),
                "sentence_bad": s(),
                "field": "syntax",
                "linguistics_term": "",
                "UID": "",
                "simple_LM_method": True,
                "one_prefix_method": False,
                "two_prefix_method": False,
                "lexically_identical": False,
                "pair_id": i,
            },
            "boolq": lambda i=i, s=s: {"question": s(), "passage": s(20), "idx": i, "label": rng.randrange(2)},
            "cb": lambda i=i, s=s: {"premise": s(), "hypothesis": s(), "idx": i, "label": rng.randrange(3)},
            "copa": lambda i=i, s=s: {
                "premise": s(),
                "choice1": s(),
                "choice2": s(),
                "question": rng.choice(["cause", "effect"]),
                "idx": i,
                "label": rng.randrange(2),
            },
            "multirc": lambda i=i, s=s: {
                "paragraph": s(20),
                "question": s(),
                "answer": s(4),
                "idx": {"paragraph": 0, "question": i // 2, "answer": i},
                "label": rng.randrange(2),
            },
            "rte": lambda i=i, s=s: {"premise": s(), "hypothesis": s(), "idx": i, "label": rng.randrange(2)},
            "wic": lambda i=i, s=s: {
                "word": "cat",
                "sentence1": "The cat sees a dog.",
                "sentence2": "A cat runs.",
                "start1": 4,
                "start2": 2,
                "end1": 7,
                "end2": 5,
                "idx": i,
                "label": rng.randrange(2),
            },
            "wsc.fixed": lambda i=i, s=s: {
                "text": "The cat sees the dog because it is big.",
                "span1_index": 1,
                "span2_index": 6,
                "span1_text": "cat",
                "span2_text": "it",
                "idx": i,
                "label": rng.randrange(2),
            },
        }[fields]()
        out.append(row)
    return out


def _publish_dataset(hf_home: Path, repo: str, configs: dict[str, dict[str, list[dict]]]) -> None:
    """The repository's files (parquet + README metadata) into the hub cache, and the
    prepared Arrow tables into the datasets cache, prepared by `datasets` from those files."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    with tempfile.TemporaryDirectory() as tmp:
        # A local copy named like the repository, so `datasets` names its cache entries as for the hub.
        files = Path(tmp) / camelcase_to_snakecase(repo.split("/")[-1])
        card = ["---", "configs:"]
        for config, splits in configs.items():
            card += [f"- config_name: {config}", "  data_files:"]
            for split, rows in splits.items():
                rel = f"{config}/{split}-00000-of-00001.parquet"
                (files / config).mkdir(parents=True, exist_ok=True)
                datasets.Dataset.from_list(rows).to_parquet(str(files / rel))
                card += [f"  - split: {split}", f"    path: {rel}"]
        (files / "README.md").write_text("\n".join(card + ["---", f"Stand-in for {repo} (tests only).", ""]))
        # `datasets` names a hub dataset's cache folder <owner>___<name>/<config>/<version>/<commit>;
        # a local folder's is <name>/<config>/<version>/<hash>: prepared so, then put in place.
        prepared = Path(tmp) / "prepared"
        for config in configs:
            datasets.load_dataset_builder(str(files), config, cache_dir=str(prepared)).download_and_prepare()
        owner = repo.split("/")[0] if "/" in repo else None
        target_root = hf_home / "datasets" / (f"{owner}___{files.name}" if owner else files.name)
        for config in configs:
            for version in (prepared / files.name / config).iterdir():
                for built in version.iterdir():
                    if built.is_dir():
                        (target_root / config / version.name).mkdir(parents=True, exist_ok=True)
                        shutil.move(str(built), target_root / config / version.name / REVISION)
        _publish(hf_home / "hub", "dataset", repo, files)


def _lm_eval_datasets(tasks: Iterable[str]) -> dict[str, dict[str, list[str]]]:
    """{dataset_path: {dataset_name or 'default': [splits]}} that lm-eval loads for these task names."""
    from mlrb.task_kit.hub import lm_eval_datasets

    return lm_eval_datasets(list(tasks))


# dataset repo -> ({config: [splits]}, row shape); configs named "default" are loaded without a name.
DATASETS: dict[str, tuple] = {
    "AlgorithmicResearchGroup/babylm": ({"default": ["train", "dev", "test"]}, "babylm"),
    "AlgorithmicResearchGroup/minipile": ({"default": ["train", "validation", "test"]}, "text"),
    "AlgorithmicResearchGroup/edge_llm_training": (
        {"c4_combined_dataset": ["train"], "alpaca_cleaned": ["train"]},
        None,
    ),
    "databricks/databricks-dolly-15k": ({"default": ["train"]}, "dolly"),
    "AlgorithmicResearchGroup/math_reasoning_autoformalization_track": ({"default": ["train"]}, "autoformalization"),
}
EVAL_SHAPES = {"cais/mmlu": "mmlu", "nyu-mll/blimp": "blimp"}  # aps/super_glue: by config name


def add_dataset(hf_home: Path, repo: str, configs: dict[str, list[str]], shape: str = "", rows: int = 4) -> None:
    rng = random.Random(repo)
    content = {}
    for config, splits in configs.items():
        config_shape = shape or {"c4_combined_dataset": "text", "alpaca_cleaned": "alpaca"}.get(config, config)
        content[config] = {split: _rows(config_shape, rows, rng) for split in splits}
        if config_shape == "mmlu":
            for split_rows in content[config].values():
                for row in split_rows:
                    row["subject"] = config
    _publish_dataset(hf_home, repo, content)


def build_mirror(hf_home: Path, eval_tasks: Iterable[str], rows: int = 4, n_autoformalization: int = 12) -> None:
    """Every stand-in the full-scale configs need, under hf_home (use it as HF_HOME)."""
    hf_home = Path(hf_home)
    for repo in MODELS:
        add_model(hf_home, repo)
    add_adapters(hf_home)
    for repo, (configs, shape) in DATASETS.items():
        add_dataset(hf_home, repo, configs, shape or "",
                    rows=n_autoformalization if shape == "autoformalization" else rows)  # fmt: skip
    for repo, configs in _lm_eval_datasets(eval_tasks).items():
        add_dataset(hf_home, repo, configs, EVAL_SHAPES.get(repo, ""), rows=2)


# What a mirror's files depend on besides this file: the task configs' dataset lists
# (mlrb/task_kit/hub.py) and the libraries that write the models, tokenizers and tables.
MIRROR_SOURCES = (Path(__file__), Path(__file__).resolve().parents[1] / "mlrb" / "task_kit" / "hub.py")
MIRROR_LIBRARIES = ("torch", "transformers", "tokenizers", "datasets", "huggingface_hub", "lm_eval", "pyarrow")


def mirror_key(eval_tasks: Iterable[str]) -> str:
    """What determines a mirror's files: its code, the libraries' versions and the evaluations."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    for source in MIRROR_SOURCES:
        digest.update(source.read_bytes())
    digest.update(json.dumps([[name, version(name)] for name in MIRROR_LIBRARIES]).encode())
    digest.update(json.dumps(sorted(eval_tasks)).encode())
    return digest.hexdigest()[:16]


def remove(hf_home: Path, kind: str, repo: str) -> None:
    """Take one stand-in out of the mirror (a model or dataset 'not downloaded')."""
    shutil.rmtree(Path(hf_home) / "hub" / f"{kind}s--{repo.replace('/', '--')}")
    if kind == "dataset":
        from datasets.naming import camelcase_to_snakecase

        owner, name = repo.split("/")
        shutil.rmtree(Path(hf_home) / "datasets" / f"{owner}___{camelcase_to_snakecase(name)}", ignore_errors=True)


if __name__ == "__main__":  # python tests/hub_mirror.py HF_HOME: build it by hand
    import sys

    build_mirror(Path(sys.argv[1]), ["mmlu", "blimp", "boolq", "cb", "copa", "multirc", "sglue_rte", "wic", "wsc"])
    print(json.dumps(sorted(p.name for p in (Path(sys.argv[1]) / "hub").iterdir()), indent=1))
