"""`rlhfkit export CKPT OUT [--base MODEL]`: a checkpoint as a Hugging Face model folder.

CKPT is a checkpoint of any run (`<output_dir>/checkpoints/step_N`, `.../best` of --ckpt.keep_best,
or the run folder for its latest): single-process or FSDP-sharded (any number of ranks), with or
without LoRA (the adapters are merged in). OUT then loads with `AutoModelForCausalLM.from_pretrained`
(a reward model: `AutoModelForSequenceClassification`), and vLLM serves it. --base names the model
the run started from when the checkpoint cannot (a LoRA base that moved, an FSDP run without its
config.json beside it).
"""

from __future__ import annotations

from rlhfkit.errors import ConfigError

USAGE = "usage: rlhfkit export CKPT OUT [--base MODEL]"


def run(argv: list[str]) -> int:
    base = None
    if "--base" in argv:
        i = argv.index("--base")
        if i + 1 >= len(argv):
            raise ConfigError(f"{USAGE}: --base needs the model the run started from")
        base, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    if len(argv) != 2 or any(a.startswith("--") for a in argv):
        raise ConfigError(f"{USAGE} (CKPT: a checkpoint folder or a run folder; OUT: a new folder)")
    from rlhfkit.api.export import export_checkpoint, resolve_checkpoint

    ckpt = resolve_checkpoint(argv[0])
    out = export_checkpoint(ckpt, argv[1], base=base)
    print(f"exported {ckpt} to {out} (load it with from_pretrained)")
    return 0
