"""A LoRA run's adapters in peft's format, beside its base model exported with hf.py:
``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(DIR), DIR/adapter)``
gives the run's model.

peft adapts a LLaMA-layout model's separate projections (``q_proj``, ..., ``down_proj``),
each with ``lora_A.weight`` (r, in) and ``lora_B.weight`` (out, r) and the update scaled by
``lora_alpha / r``: vaswani's parts of ``in_proj`` and ``linear1`` are those projections
(nn/lora.py), so the adapters are renamed, not changed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import checkpoint
from . import ExportError

ADAPTER = "adapter"  # the folder, inside an hf export of a LoRA run, that holds the adapters
PROJECTIONS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
               "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
               "down": "mlp.down_proj"}
NAME = re.compile(r"decoder\.layers\.(\d+)\.\w+\.\w+\.lora_([AB])\.(\w+)")


def peft_name(name: str, where: Path | str = "the run") -> str:
    """peft's name for one of vaswani's adapter tensors (``decoder.layers.0.self_attn.
    in_proj.lora_A.q`` -> ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    if ".experts." in name:
        raise ExportError(f"{where}: {name!r} adapts an expert of a mixture of experts, which "
                          "peft's format has no place for (transformers keeps the experts "
                          "as 3D tensors); pass --merge for the merged model, or train "
                          "adapters on q, k, v and o only")
    match = NAME.fullmatch(name)
    if match is None:  # a bug, or a file of another kind of run
        raise ExportError(f"{where}: {name!r} is not a LoRA adapter of a language model's "
                          "layer; peft's format has no place for it")
    layer, which, part = match.groups()
    return f"base_model.model.model.layers.{layer}.{PROJECTIONS[part]}.lora_{which}.weight"


def adapter_tensors(adapters: Path) -> dict:
    """The run's adapters (a weights file) under peft's names."""
    return {peft_name(name, adapters): t.float().contiguous()
            for name, t in checkpoint.read_weights(adapters).items()}


def write(finetune, adapters: Path, architecture, out: Path, base: Path) -> None:
    """A LoRA run's adapters (the weights file ``adapters``, trained as ``finetune`` says)
    into ``out`` in peft's format, for the base model written at ``base`` (the export's final
    place) as ``architecture`` (vaswani/architectures/)."""
    from safetensors.torch import save_file

    from ..architectures import known

    f = finetune
    if not architecture.peft:
        ours = ", ".join(name for name, a in known().items() if a.peft)
        raise ExportError(f"cannot write peft adapters for a {architecture.name} model: "
                          f"vaswani's adapters are those of {ours}'s projections; pass "
                          "--merge for the merged model instead")
    out.mkdir(parents=True)
    save_file(adapter_tensors(adapters), str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": f.rank,
              "lora_alpha": f.alpha, "lora_dropout": f.dropout, "bias": "none",
              "target_modules": sorted({PROJECTIONS[t].split(".")[1] for t in f.targets}),
              "base_model_name_or_path": str(base), "inference_mode": True,
              "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "modules_to_save": None}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
