"""Load a trained model version from `$GEM_HOME/models/<version>` into one unsharded GemModel.

Training saves the sharded state with torch.distributed.checkpoint; DCP reshards on load, so a
single process (or any other world size) can read it back into plain tensors. The manifest records
the size and sha256 of every checkpoint file (`checkpoint_files`), verified before loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from gem_model.config import DOWNSTREAM_SECTIONS, ConfigError, GemConfig
from gem_model.integrity import CorruptArtefactError, verify_files
from gem_model.models.gem import GemModel
from gem_model.train.manifest import read_manifest, retrain_hint

# Keys in the checkpoint: "model." + GemTrain's state dict, whose GemModel lives under "model.".
_PREFIX = "model."


@dataclass
class LoadedModel:
    model: GemModel
    config: GemConfig
    manifest: dict[str, Any]
    device: torch.device
    bf16: bool = False  # autocast scoring's forward to bfloat16 (see `bf16_supported`)

    @property
    def version(self) -> str:
        return str(self.manifest["model_version"])

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware: a CUDA GPU that does, or a CPU with AVX512-BF16 or
    AMX (torch.cpu's own probes). Elsewhere bfloat16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


# Student settings that name the teacher's features: kept with them, or a teacher trained on its own
# features (gem_model/configs) would fail the check that the students' features are among them.
STUDENT_FEATURE_SETTINGS = ("features", "adapter_features")


def teacher_config(manifest: dict[str, Any]) -> GemConfig:
    """The config a teacher was trained with; the sections read after training (`DOWNSTREAM_SECTIONS`)
    take today's defaults, so a teacher stays loadable when the export or student settings evolve,
    except the students' feature lists, which name the teacher's features. A teacher section this code no
    longer reads (a setting since removed or moved) is a ConfigError that says to retrain."""
    saved = manifest["config"]
    teacher = {k: v for k, v in saved.items() if k not in DOWNSTREAM_SECTIONS}
    student = {k: v for k, v in saved.get("student", {}).items() if k in STUDENT_FEATURE_SETTINGS}
    try:
        return GemConfig.from_dict({**teacher, "student": student})
    except ConfigError as e:
        raise ConfigError(
            f"model version {manifest.get('model_version')!r} was trained with a config this code no "
            f"longer reads ({e}); materialise teacher_model again to train it anew"
        ) from None


def load_model(model_dir: Path, device: torch.device | None = None, bf16: bool = False) -> LoadedModel:
    """The model version at `model_dir`, unsharded, in eval mode on `device` (CPU when None); `bf16` asks
    for bfloat16 scoring, granted where the device supports it (`bf16_supported`)."""
    manifest = read_manifest(model_dir)
    checkpoint = model_dir / "checkpoint"
    if not checkpoint.is_dir():
        raise CorruptArtefactError(f"{checkpoint} is missing (the manifest is there); {retrain_hint(model_dir)}")
    if "checkpoint_files" not in manifest:
        raise CorruptArtefactError(
            f"{model_dir / 'manifest.json'} records no checkpoint_files to verify the "
            "checkpoint against (written before checksums were kept); "
            f"{retrain_hint(model_dir)}"
        )
    verify_files(checkpoint, manifest["checkpoint_files"], retrain_hint(model_dir))
    config = teacher_config(manifest)
    model = GemModel(config.features, config.model)
    state = {f"{_PREFIX}{k}": v for k, v in model.state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=str(checkpoint))
    model.load_state_dict({k.removeprefix(_PREFIX): v for k, v in state.items()})
    device = device or torch.device("cpu")
    model.to(device).eval()
    return LoadedModel(model, config, manifest, device, bf16=bf16 and bf16_supported(device))
