"""The pipeline's fixed vocabularies, named once: surfaces, tasks, data sources, architectures, student variants.

A config field that takes one of them declares it with a `OneOf` marker, so a value outside it is refused
when the config is built, and docs/CONFIG.md lists the choices.
"""

from __future__ import annotations

# The ad surfaces: the synthetic world has a traffic share for each, the real sources map onto them, and the
# quarantine rejects the rest.
SURFACES: tuple[str, ...] = ("feed", "stories", "reels", "messaging", "offsite")
# The teacher's tasks, in the order of its logits, following the funnel (ESMM): `ctr` = P(click | impression),
# `cvr` = P(conversion | click).
TASKS: tuple[str, ...] = ("ctr", "cvr")
# Where bronze comes from: the synthetic world, seven real public datasets, or the user's own logs (a mapping).
DATA_SOURCES: tuple[str, ...] = (
    "synthetic",
    "taobao",
    "ali_ccp",
    "aliexpress",
    "criteo",
    "open_bandit",
    "frappe",
    "movielens",
    "mapping",
)
# The teacher (`gem`) and the baselines trained in the same framework.
ARCHITECTURES: tuple[str, ...] = ("gem", "dlrm", "dcnv2", "lr")
# What the per-surface students are trained from (`gem_model.distill.variants`).
STUDENT_VARIANTS: tuple[str, ...] = ("labels", "kd", "adapter", "kd_embeddings", "adapter_no_embeddings")
