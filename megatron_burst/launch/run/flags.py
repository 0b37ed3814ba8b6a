"""Config -> the Megatron command line that `python -m megatron_burst.megatron.pretrain_gpt` takes.

Every flag here is an upstream Megatron-LM flag except `--cp-comm-type burst` /
`a2a+burst` and `--burst-*`, which the adapter (`megatron_burst.megatron.arguments`)
registers. Tests feed the output to Megatron's own parser so the two cannot drift.

The GPU machines have neither TransformerEngine nor apex, so the flags ask for Megatron's
local transformer implementation and turn off the fusions that need those libraries.
"""
from __future__ import annotations

import re
import shlex
import typing

from ...decide.topology import RING_COMM_TYPE
from ..config.burst import run_problem, topology_of
from ..config.schema import VARIABLE, Config, ConfigError, expand_vars
from ..planning.job_plan import job_plan
from ..config.model import MLA_KEYS, ModelConfig

SPEC = ("megatron_burst.megatron.spec", "get_llama_layer_burst_spec")
ENTRY_POINT = "megatron_burst.megatron.pretrain_gpt"
LAUNCHERS = ("none", "torchrun")
# Megatron requires it with TP or CP on pre-Blackwell GPUs (ordered comm kernels).
LAUNCH_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def torchrun_words(cfg: Config, program: list[str], rdzv_id: str) -> list[str]:
    """``program`` (torchrun, or ``python -m torch.distributed.run``) with the options that
    start ``cfg``'s ranks on one node, up to the entry point's module.

    One node: --standalone. Several: the c10d rendezvous at ${MASTER_ADDR}:${MASTER_PORT},
    left for the shell of each node to fill in (the same command runs on every node).
    """
    c = cfg.cluster
    words = [*program]
    if c.nodes == 1:
        words.append("--standalone")
    else:
        words += ["--nnodes", str(c.nodes), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", "${MASTER_ADDR}:${MASTER_PORT}", "--rdzv-id", rdzv_id]
    return words + ["--nproc-per-node", str(c.gpus_per_node), "-m", ENTRY_POINT]


def launch_line(cfg: Config, launcher: str, rdzv_id: str) -> list[str]:
    """The words before the flags for `flags --launcher`: nothing, or the environment and
    torchrun command that start the entry point."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if launcher == "none":
        return []
    return [*(f"{k}={v}" for k, v in LAUNCH_ENV.items()),
            *torchrun_words(cfg, ["torchrun"], rdzv_id)]


def megatron_flags(cfg: Config, *, env: typing.Mapping[str, str] | None = None,
                   expand: bool = True, save: str | None = None,
                   load: str | None = None) -> list[str]:
    """The Megatron argument list for ``cfg``, one group of flags after the other.

    ``expand``: replace ${VAR} from ``env`` (default os.environ), failing on unset ones;
    False keeps them for a shell script to expand. ``save``/``load``: checkpoint folders.
    """
    def path(text: str, key: str) -> str:
        return expand_vars(text, key, env) if expand else text

    f = model_flags(cfg.model) + parallel_flags(cfg) + implementation_flags()
    f += training_flags(cfg) + data_flags(cfg, path, expand)
    problem = run_problem(cfg)  # the schema's rules; the adapter's too, here before a job queues
    if problem is not None:
        raise problem
    f += document_flags(cfg) + output_flags(cfg, save, load)
    return f + [path(a, f"megatron_args[{i}]") for i, a in enumerate(cfg.megatron_args)]


def model_flags(m: ModelConfig) -> list[str]:
    """The model's shape (Llama: RMSNorm, SwiGLU, RoPE, no biases, untied output layer)."""
    f: list[str] = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        "--seq-length", str(m.seq_length),
        "--max-position-embeddings", str(m.max_position_embeddings or m.seq_length),
        "--position-embedding-type", m.position_embedding,
        "--rotary-base", str(m.rotary_base),
        "--normalization", m.normalization,
        "--norm-epsilon", repr(m.norm_epsilon),
        "--init-method-std", repr(m.init_method_std),
        "--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by),
        "--disable-bias-linear",
        "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0",
    ]
    if m.num_query_groups != m.num_attention_heads:
        f += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    f += attention_flags(m)
    if m.activation == "swiglu":
        f += ["--swiglu"]
    if m.untie_embeddings:
        f += ["--untie-embeddings-and-output-weights"]
    return f


def parallel_flags(cfg: Config) -> list[str]:
    """The parallel sizes (data parallelism is what is left of the world size) and the CP
    topology."""
    p = cfg.parallel
    f = [
        "--tensor-model-parallel-size", str(p.tensor),
        "--pipeline-model-parallel-size", str(p.pipeline),
        "--context-parallel-size", str(p.context),
    ]
    if p.sequence_parallel and p.tensor > 1:
        f += ["--sequence-parallel"]
    return f + burst_flags(cfg)


def burst_flags(cfg: Config) -> list[str]:
    """The CP topology the attention runs, as --cp-comm-type and the --burst-* flags."""
    if cfg.parallel.context == 1:
        # The spec's layers are BurstAttention at CP=1 too (one kernel call, no ring); the
        # entry point's document masks need --cp-comm-type to say so.
        return ["--cp-comm-type", RING_COMM_TYPE]
    # The topology `plan` reports, resolved once here ('auto' by the time model with the
    # cluster's profile), so the adapter runs exactly it and decides nothing again.
    topology = topology_of(cfg)
    f = ["--cp-comm-type", topology.cp_comm_type,
         "--burst-backward", topology.backward,
         "--burst-ulysses-size", str(topology.ulysses)]
    if topology.double:
        f += ["--burst-intra-node-size", str(topology.intra_node_size)]
    if topology.hierarchical_sizes:
        f += ["--hierarchical-context-parallel-sizes", *map(str, topology.hierarchical_sizes)]
    return f


def implementation_flags() -> list[str]:
    """The layer spec and Megatron's local implementation, without the fusions that need
    TransformerEngine or apex (see the module docstring)."""
    # BurstAttention reads no attention mask; upstream pretrain_gpt.py would otherwise build
    # a dense [s, s] one per sample in the dataloader (2.5 s per iteration at 16K tokens).
    return ["--no-create-attention-mask-in-dataloader",
            "--spec", *SPEC, "--transformer-impl", "local",
            "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--no-rope-fusion", "--no-persist-layer-norm"]


def training_flags(cfg: Config) -> list[str]:
    """Optimizer, schedule, precision and recompute."""
    tr = cfg.training
    f = [
        "--micro-batch-size", str(tr.micro_batch_size),
        "--global-batch-size", str(tr.global_batch_size),
        "--train-iters", str(tr.train_iters),
        "--lr", repr(tr.lr),
        "--min-lr", repr(tr.min_lr),
        "--lr-decay-style", tr.lr_decay_style,
        "--lr-warmup-iters", str(tr.lr_warmup_iters),
        "--weight-decay", repr(tr.weight_decay),
        "--clip-grad", repr(tr.clip_grad),
        "--adam-beta1", repr(tr.adam_beta1),
        "--adam-beta2", repr(tr.adam_beta2),
        "--seed", str(tr.seed),
    ]
    if tr.precision == "bf16":
        f += ["--bf16"]
    if tr.distributed_optimizer:
        f += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if tr.recompute == "full":
        f += ["--recompute-granularity", "full", "--recompute-method", tr.recompute_method,
              "--recompute-num-layers", str(tr.recompute_num_layers)]
        if cfg.burst.remat_aware:
            f += ["--burst-remat-aware"]
    elif tr.recompute == "selective":
        f += ["--recompute-granularity", "selective"]
    return f


def data_flags(cfg: Config, path: typing.Callable[[str, str], str], expand: bool) -> list[str]:
    """Data and tokenizer; ``path`` expands a ${VAR} in a path (or keeps it: ``expand``
    False)."""
    d = cfg.data
    f: list[str] = []
    if d.mock:
        f += ["--mock-data"]
    elif d.data_path:
        words = data_path_words(path(d.data_path, "data.data_path"), d.data_path)
        if not expand:  # kept whole: the sbatch script or the pasted line splits it
            words = [d.data_path]
        f += ["--data-path", *words, "--split", d.split]
    f += ["--tokenizer-type", d.tokenizer_type]
    if d.tokenizer_model:
        f += ["--tokenizer-model", path(d.tokenizer_model, "data.tokenizer_model")]
    if d.tokenizer_type == "NullTokenizer":
        f += ["--vocab-size", str(cfg.model.vocab_size)]
    return f


def document_flags(cfg: Config) -> list[str]:
    """Document masks and how their batches are placed on the CP ranks, or the slice masks'
    builder."""
    d = cfg.data
    if d.mask_builder is not None:
        return ["--burst-mask-builder", d.mask_builder]
    if not d.document_mask:
        return []
    f = ["--burst-document-mask"]
    if d.document_layout is not None:
        f += ["--burst-document-layout", d.document_layout]
    if d.document_capacity is not None:
        f += ["--burst-document-capacity", str(d.document_capacity)]
    return f


def output_flags(cfg: Config, save: str | None, load: str | None) -> list[str]:
    """Logging and checkpoints."""
    tr = cfg.training
    f = ["--log-interval", str(tr.log_interval), "--log-throughput",
         "--eval-interval", str(tr.eval_interval), "--eval-iters", str(tr.eval_iters)]
    if save:
        f += ["--save", save, "--save-interval", str(save_interval(cfg))]
    if load:
        f += ["--load", load]
    return f


def save_interval(cfg: Config) -> int:
    """Iterations between saves: the config's, else the job plan's (saves sized to the
    checkpoint and the step), else, where no step time is predicted (CPU ranks), one save
    at the end. Megatron requires one with --save."""
    if cfg.training.save_interval is not None:
        return cfg.training.save_interval
    if not cfg.cluster.hardware.timed:
        return cfg.training.train_iters
    return job_plan(cfg).save_interval


def attention_flags(m: ModelConfig) -> list[str]:
    """Megatron's flags for the model's attention variant: sinks, sliding-window layers, MLA
    and Q/K norms (nothing for plain Llama attention)."""
    f: list[str] = []
    if m.qk_layernorm:
        f += ["--qk-layernorm"]
    if m.softmax_type != "vanilla":
        f += ["--softmax-type", m.softmax_type]
    if m.window_size is not None:
        f += ["--window-size", ",".join(map(str, m.window_size))]
        if m.window_attn_skip_freq is not None:
            f += ["--window-attn-skip-freq", str(m.window_attn_skip_freq)]
    if m.multi_latent_attention:
        # MLA's own RoPE type defaults to YaRN; the config's position_embedding says rope.
        f += ["--multi-latent-attention", "--rope-type", "rope"]
        for key in MLA_KEYS:
            if getattr(m, key) is not None:
                f += [f"--{key.replace('_', '-')}", str(getattr(m, key))]
    return f


def data_path_words(text: str, written: str) -> list[str]:
    """The words of an expanded data path: one dataset prefix, or a blend of weight-prefix
    pairs ("0.7 a 0.3 b"); ConfigError for an empty one or a blend Megatron would refuse."""
    words = text.split()
    where = f"'data.data_path' ({written!r} gives {text!r})"
    if not words:
        raise ConfigError(f"{where} is empty: set it to a dataset prefix or a blend of "
                          f"weight-prefix pairs")
    if len(words) > 1:
        weights = words[::2]
        if len(words) % 2 or not all(re.fullmatch(r"\d+(\.\d*)?|\.\d+", w) for w in weights):
            raise ConfigError(f"{where}: a blend is weight-prefix pairs, e.g. \"0.7 a 0.3 "
                              f"b\"; got {len(words)} words")
    return words


def split_word(token: str) -> str:
    """``token`` for a pasted command line where each ${NAME} may hold several words (a data
    blend): unquoted, so the shell splits it, with ``:?`` so an unset or empty one stops the
    command with a message; the text around it single-quoted."""
    out, at = [], 0
    for m in VARIABLE.finditer(token):
        if m.start() > at:
            out.append(shlex.quote(token[at:m.start()]))
        name = m.group(1)
        out.append(f"${{{name}:?set {name}: one dataset prefix or a weight-prefix blend}}")
        at = m.end()
    if at < len(token):
        out.append(shlex.quote(token[at:]))
    return "".join(out)


def double_quoted(token: str) -> str:
    """``token`` for bash: bare when plainly safe, else in double quotes, so that a ${VAR} in
    it expands and nothing else does: '"', '\\', '`' and any '$' that does not begin a
    ${NAME} are escaped (the loader refuses such a '$' already; a Config built in Python
    has not been through it)."""
    if re.fullmatch(r"[A-Za-z0-9_.:/=+@%-]+", token):
        return token
    escaped = re.sub(r'(["\\`])', r"\\\1", token)
    escaped = re.sub(r"\$(?!\{[A-Za-z_][A-Za-z0-9_]*\})", r"\\$", escaped)
    return '"' + escaped + '"'


def shell_word(token: str) -> str:
    """``token`` quoted for a pasted command line: an unexpanded ${VAR} in double quotes, so
    the shell it is pasted into fills it in; anything else in single quotes, taken literally
    (an expanded path may hold any character)."""
    return double_quoted(token) if VARIABLE.search(token) else shlex.quote(token)


def format_flags(flags: list[str]) -> str:
    """One flag (with its values) per line, shell-continued, for printing. A data path's
    words are each quoted, and a ${VAR} in one (``--keep-vars``) is left for the shell to
    split into words (``split_word``)."""
    lines: list[str] = []
    flag = None
    for a in flags:
        if a.startswith("--") or not lines:
            flag = a
            lines.append(shell_word(a))
        else:
            words = ([split_word(w) for w in a.split()] if flag == "--data-path"
                     else [shell_word(a)])
            lines[-1] += " " + " ".join(words)
    return " \\\n    ".join(lines)
