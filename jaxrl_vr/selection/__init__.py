"""Prompt-distribution control: which prompts, how many samples (SPEC §4)."""

from jaxrl_vr.selection.anchor import (
    DEFAULT_TAU_HIGH,
    DEFAULT_TAU_LOW,
    POLARITIES,
    anchor_mask,
    anchored_kl_terms,
    anchored_kl_weight,
    expand_to_responses,
)
from jaxrl_vr.selection.dynamic import (
    DynamicBatch,
    DynamicBatcher,
    RecheckSchedule,
    informative_groups,
    prob_all_wrong,
    prob_uninformative,
)
from jaxrl_vr.selection.pairing import (
    PairedPromptSource,
    PairPools,
    PromptChoice,
    pairing_pools,
    pairs_from_tracker,
    select_pairs,
    tracker_rates,
)
from jaxrl_vr.selection.tracker import PromptTracker, success_counts
from jaxrl_vr.selection.two_stage import (
    adaptive_group_sizes,
    continuation_counts,
    group_valid_mask,
    merge_probe_and_continuation,
    probe_continue,
    probe_pass_rate,
)

__all__ = [
    "DEFAULT_TAU_HIGH",
    "DEFAULT_TAU_LOW",
    "POLARITIES",
    "DynamicBatch",
    "DynamicBatcher",
    "PairPools",
    "PairedPromptSource",
    "PromptChoice",
    "PromptTracker",
    "RecheckSchedule",
    "adaptive_group_sizes",
    "anchor_mask",
    "anchored_kl_terms",
    "anchored_kl_weight",
    "continuation_counts",
    "expand_to_responses",
    "group_valid_mask",
    "informative_groups",
    "merge_probe_and_continuation",
    "pairing_pools",
    "pairs_from_tracker",
    "prob_all_wrong",
    "prob_uninformative",
    "probe_continue",
    "probe_pass_rate",
    "select_pairs",
    "success_counts",
    "tracker_rates",
]
