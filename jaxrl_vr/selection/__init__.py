"""Prompt-distribution control: which prompts, how many samples (SPEC §4).

The data order and the sources that wrap it, the per-prompt tracker, the batch
strategies (``strategies``: plain, DAPO dynamic sampling, two-stage probing), PBA's anchor
band and positive–negative pairing.
"""

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
    DynamicStats,
    RecheckSchedule,
    SkipSuspended,
    dynamic_batch,
    informative_groups,
    prob_all_wrong,
    prob_uninformative,
)
from jaxrl_vr.selection.order import DataOrder
from jaxrl_vr.selection.pairing import (
    PairedPromptSource,
    PairedSource,
    PairPools,
    PromptChoice,
    pairing_pools,
    pairs_from_tracker,
    select_pairs,
    tracker_rates,
)
from jaxrl_vr.selection.strategies import (
    BATCH_STRATEGIES,
    DynamicSettings,
    StrategyContext,
    TwoStageSettings,
    make_batch_strategy,
    plain_batch,
)
from jaxrl_vr.selection.tracker import PromptTracker, success_counts
from jaxrl_vr.selection.two_stage import (
    adaptive_group_sizes,
    continuation_counts,
    group_valid_mask,
    merge_probe_and_continuation,
    probe_continue,
    probe_pass_rate,
    two_stage_batch,
    TwoStageStats,
)

__all__ = [
    "BATCH_STRATEGIES",
    "DataOrder",
    "DynamicSettings",
    "DynamicStats",
    "PairedSource",
    "SkipSuspended",
    "StrategyContext",
    "TwoStageSettings",
    "TwoStageStats",
    "dynamic_batch",
    "make_batch_strategy",
    "plain_batch",
    "two_stage_batch",
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
