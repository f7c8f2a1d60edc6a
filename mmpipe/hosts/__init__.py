"""Hosts: encoded rows inside the trainers people already run.

One module per host; each imports its host package lazily (inside the functions that need it),
so mmpipe works, and these modules import, without the host installed::

    trainer.py  transformers ``Trainer`` / TRL ``SFTTrainer``: `TrainerCollator` (a Mapping of
                forward kwargs + labels) and the settings an encoded dataset needs
    resume.py   the same hosts' ``resume_from_checkpoint`` / ``load_best_model_at_end``:
                `restore_checkpoint_weights` (transformers 5 reloads renamed checkpoints unkeyed)
    trl_grpo.py TRL ``GRPOTrainer``: `VisionGRPOTrainer` (mmpipe's prompts, rollout and policy
                batch: images in generation and in the loss, vision tokens banned, exact positions)
    verl.py     verl: rows -> RLHFDataset-style row dicts (`verl_rows`) and DataProto-ready
                tensors + object arrays (`verl_batch`)
"""

from __future__ import annotations

from mmpipe._lazy import lazy_exports

_EXPORTS = {
    "mmpipe.hosts.trainer": ("TrainerCollator", "trainer_settings", "sft_settings"),
    "mmpipe.hosts.resume": ("restore_checkpoint_weights", "load_checkpoint_weights"),
    "mmpipe.hosts.trl_grpo": ("VisionGRPOTrainer", "grpo_settings"),
    "mmpipe.hosts.verl": ("verl_rows", "verl_batch", "collate_verl_rows", "verl_prompt_rows",
                          "verl_images_from_messages"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
