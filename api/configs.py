"""The records the jobs take and return, under the names the public API gives them (`fs.BuildConfig`,
`fs.ProbeConfig`, `fs.ProbeResult`, `fs.ZooConfig`): defined by the jobs (workflows/), re-exported here so that the
front door (featstore/__init__.py) reaches every public name through the API. Importing this module imports the
jobs; nothing imports it but the front door, on first use of one of these names."""

from featstore.workflows.build import BuildConfig
from featstore.workflows.probe import ProbeConfig, ProbeResult
from featstore.workflows.zoo import ZooConfig

__all__ = ["BuildConfig", "ProbeConfig", "ProbeResult", "ZooConfig"]
