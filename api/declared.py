"""Every value, default and choice the library declares, as the CLI's options read them (featstore.cli.options):
the records (`ModelSpec`, `ImageSource`, `RunOptions`), `featstore.schema`'s fields and defaults, the scopes, the
bands and the exit policies' defaults. The CLI reads them here, through the API, so that it imports nothing
beneath it; each name is the library's own object, imported from the module that declares it (all of them light:
the CLI's `--help` loads this module)."""

from featstore.analytics.exit_policies import DEFAULT_POLICIES, MAX_THRESHOLDS
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions, split_options
from featstore.schema import (
    BANDS,
    COST_BATCH_SIZES,
    CSS_DISTANCES,
    DDB_VARIANTS,
    DEMO_DATASET,
    FIELDS,
    FIGURE_FORMATS,
    JOINT_MIN_CONF,
    MIN_CONF,
    PER_PAIR,
    SCOPES,
    TIMM_WEIGHTS,
    VARIANT,
    VIEW,
    Int,
    K,
    Number,
    Real,
    Size,
    Text,
    Value,
    comma_list,
    shown,
)

__all__ = ["BANDS", "COST_BATCH_SIZES", "CSS_DISTANCES", "DDB_VARIANTS", "DEFAULT_POLICIES", "DEMO_DATASET",
           "FIELDS", "FIGURE_FORMATS", "JOINT_MIN_CONF", "K", "MAX_THRESHOLDS", "MIN_CONF", "PER_PAIR", "SCOPES",
           "TIMM_WEIGHTS", "VARIANT", "VIEW", "ImageSource", "Int", "ModelSpec", "Number", "Real", "RunOptions",
           "Size", "Text", "Value", "comma_list", "shown", "split_options"]
