"""A featstore database read from Python, read-only (`connect`): SQL, the runs, and what each query command
prints (the k-sweep, its spread, one image's timeline, the comparison of definitions, early exit, the tap grid,
DDB and CSS, the report), each a thin call of the analytics function that computes it. (Analytics' queries load
DuckDB and Polars, which `fs.connect` as a name must not: each method imports what it runs.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from featstore.analytics.exit_policies import DEFAULT_POLICIES
from featstore.analytics.plain_rows import Rows
from featstore.errors import FeatstoreError, FeatstoreTypeError, Name
from featstore.schema import BAND, CSS_DISTANCES, JOINT_MIN_CONF, MIN_CONF, PER_PAIR, SCOPE, TOP_N

if TYPE_CHECKING:
    import polars as pl

    from featstore.analytics.queries import Comparison

Runs = str | Sequence[str] | None  # run ids: a list, or a comma list as `--run` takes it (an id's own commas kept)
Ks = int | Sequence[int] | None  # stability windows: one, or a list (numpy's integers and arrays too)


@dataclass(frozen=True)
class Sweep:
    """A k-sweep (or its spread over a set of probes): `table` every column, `shown` what `featstore timeline`
    prints of it, `notes` the caveats of windows at which no stable l* can be late."""

    table: pl.DataFrame
    shown: pl.DataFrame
    notes: list[str]


@dataclass(frozen=True)
class SweepRows:
    """A k-sweep as `featstore timeline` prints it, in plain rows (`Rows`: read without Arrow or Polars), and the
    caveats of windows at which no stable l* can be late."""

    shown: Rows
    notes: list[str]


@dataclass(frozen=True)
class ImageTimeline:
    """One image under every run (or the runs named): its label, file and split, the window `k` whose l* is
    marked, `table` one row per run and anchor, `shown` one row per anchor and one column per run."""

    image_id: int
    label: str
    path: str
    split: str
    k: int
    table: pl.DataFrame
    shown: pl.DataFrame


@dataclass(frozen=True)
class ExitSimulation:
    """Early exit of one run: the device its costs were measured on, the one line saying which images every policy
    counts, every policy's accuracy and cost, and the Pareto front as `featstore exit-sim` shows it."""

    run_id: str
    device: str
    population: str
    simulation: pl.DataFrame
    pareto: pl.DataFrame


@dataclass(frozen=True)
class TapGrid:
    """Layer x module probing of one run: accuracy per (block, tap) (`grid`, and `table` blocks x taps), and the
    strategies' gain recovered (`gains`)."""

    run_id: str
    grid: pl.DataFrame
    table: pl.DataFrame
    gains: pl.DataFrame


class Results:
    """A featstore database, read-only through the sandbox `featstore sql` uses (each query opens and closes it, so
    a probe job can write between two queries)."""

    def __init__(self, db: str | Path | Sequence[str | Path]):
        from featstore.analytics.read_only import open_read_only

        self.db = _read_paths(db)
        open_read_only(self.db).close()  # a missing or foreign file is an error now

    def sql(self, query: str, params: Sequence | dict | None = None) -> pl.DataFrame:
        """One statement -> a Polars DataFrame (the macros of `sql/` are there: decision_layers(2), ...)."""
        from featstore.analytics.queries import query as run_query

        return run_query(self.db, _statement(query), params)

    def stream(self, query: str, params: Sequence | dict | None = None) -> Iterator[pl.DataFrame]:
        """One statement's result as frames of bounded size, in order (`featstore sql`): memory stays bounded at
        any row count; closing the iterator early (or Ctrl-C) cancels the query."""
        from featstore.analytics.queries import stream

        return stream(self.db, _statement(query), params)

    def stream_rows(self, query: str, params: Sequence | dict | None = None) -> Iterator[Rows | pl.DataFrame]:
        """As `stream`, but a result whose every column is a number, text or a boolean comes as `Rows` (Python
        values, read without importing Arrow or Polars: `featstore sql` answers at once)."""
        return stream_rows(self.db, query, params)

    @property
    def runs(self) -> pl.DataFrame:
        from featstore.analytics.queries import runs

        return runs(self.db)

    def timeline(self, run: str, image_id: int) -> pl.DataFrame:
        """One image's predictions and confidences under one run, one row per anchor."""
        from featstore.analytics.selection import image_id as checked_id

        if not isinstance(run, str):
            raise FeatstoreTypeError("give a run id (.runs lists them)", field="run", value=run)
        frame = self.sql("SELECT anchor, pred, conf FROM predictions WHERE run_id = ? AND image_id = ? "
                         "ORDER BY anchor", [run, checked_id(image_id)])
        if not len(frame):
            raise FeatstoreError(f"no predictions of image {image_id} under run {run!r} (see .runs)")
        return frame

    def window(self, ks: Ks = None, runs: Runs = None) -> int:
        """The one stability window a one-window result shows: the one k given; of several (the default 1..4
        among them), 2; a list without 2 is refused (analytics/selection.py `one_window`)."""
        from featstore.analytics.selection import one_window, run_ids, windows

        return one_window(self.db, windows(ks), run_ids(runs))

    def only_run(self, run: str | None = None) -> str:
        """The run a one-run result is of: `run`, else the database's only run (several: an error naming them)."""
        from featstore.analytics.selection import only_run

        return only_run(self.db, run)

    def notes(self, ks: Ks, runs: Runs = None) -> list[str]:
        """The caveats of windows `ks` at which no stable l* can be late, for the anchor counts of these runs."""
        from featstore.analytics.report import late_notes
        from featstore.analytics.selection import run_ids, windows

        chosen, shown = run_ids(runs), self.runs
        if chosen is not None:
            shown = shown.filter(shown["run_id"].is_in(chosen))
        return late_notes(sorted({n - 1 for n in shown["n_anchors"]}), windows(ks) or [])

    def decision_layers(self, k: int, scope: str = SCOPE, min_conf: float = MIN_CONF, band: str = BAND) -> pl.DataFrame:
        """l*(k) of every image under every run, with its early/mid/late `band` (the macro decision_layers, its band
        named by decision_band: 'paper' = thirds of T, 'window' = thirds of T - k), as `featstore sql` gives it."""
        from featstore.analytics.queries import decision_layers
        from featstore.analytics.selection import fraction

        return decision_layers(self.db, self.window(k), scope, fraction(min_conf, "min_conf"), band)

    def k_sweep(self, ks: Ks = None, scope: str = SCOPE, min_conf: float = MIN_CONF, runs: Runs = None,
                band: str = BAND) -> Sweep:
        """The decision layers' statistics per run and window k (`featstore timeline`); `band`: 'paper' (thirds
        of T) or 'window' (thirds of T - k)."""
        from featstore.analytics.queries import k_sweep
        from featstore.analytics.selection import fraction, run_ids, windows

        ks = windows(ks)
        frame = k_sweep(self.db, ks, scope, fraction(min_conf, "min_conf"), run_ids(runs), band)
        notes = self.notes(ks or sorted(set(frame["k"])), frame["run_id"].to_list()) if band == "paper" else []
        return Sweep(frame, frame.drop("model", "view", "probe"), notes)

    def k_sweep_rows(self, ks: Ks = None, scope: str = SCOPE, min_conf: float = MIN_CONF, runs: Runs = None,
                     band: str = BAND) -> SweepRows:
        """`k_sweep`'s `shown` and `notes` as plain rows, read on one connection without Arrow or Polars
        (`featstore timeline`)."""
        return k_sweep_rows(self.db, ks, scope, min_conf, runs, band)

    def spread(self, ks: Ks = None, scope: str = SCOPE, runs: Runs = None, min_conf: float = MIN_CONF,
               refits: bool = False) -> Sweep:
        """The k-sweep over a set of probes (`timeline --spread`): each fraction with a 95% bootstrap interval over
        the images (`refits`: over the images and the probe seeds, every seed of each run in the set), the share
        whose band holds under every family's vote and Fleiss' kappa of those votes, and each fraction's range."""
        from featstore.analytics.report_robustness import spread_table
        from featstore.analytics.robustness import robust_sweep
        from featstore.analytics.selection import fraction, run_ids, windows

        frame = robust_sweep(self.db, windows(ks), scope, run_ids(runs), fraction(min_conf, "min_conf"),
                             refits=refits)
        if frame.is_empty():
            raise FeatstoreError("no images that every probe of the set counts in this scope; pass ", Name("runs"),
                                 " or ", Name("scope"))
        return Sweep(frame, spread_table(frame), self.notes(sorted(set(frame["k"])), frame["run_id"].to_list()))

    def image_timeline(self, image_id: int, k: Ks = None, runs: Runs = None) -> ImageTimeline:
        """One image's class and confidence at every anchor of every run (or of the runs named), its l*(k) marked
        (`featstore timeline --image`); k: the one window (`window`)."""
        from featstore.analytics.report import image_timeline, image_timeline_table
        from featstore.analytics.selection import image_id as checked_id
        from featstore.analytics.selection import run_ids

        image_id, chosen = checked_id(image_id), run_ids(runs)
        k = self.window(k, chosen)
        frame = image_timeline(self.db, image_id, k, chosen)
        first = frame.row(0, named=True)
        return ImageTimeline(int(image_id), str(first["label_name"] or first["label"]), first["path"],
                             first["split"], k, frame, image_timeline_table(frame))

    def compare(self, runs: Runs = None, k: Ks = None, min_conf: float = JOINT_MIN_CONF, scope: str = SCOPE,
                per_pair: int = PER_PAIR) -> Comparison:
        """l*(k), prediction depth and the joint criterion of each run (default: the clean runs), compared image by
        image (`featstore compare`); k: the one window (`window`)."""
        from featstore.analytics.queries import compare
        from featstore.analytics.selection import fraction, plain, run_ids

        chosen = run_ids(runs)
        return compare(self.db, chosen, self.window(k, chosen), fraction(min_conf, "min_conf"), scope,
                       plain(per_pair))

    def early_exit(self, run: str | None = None, ks: Ks = None,
                   thresholds: float | Sequence[float] | None = None,
                   combined_thresholds: float | Sequence[float] | None = None,
                   device: str | None = None, batch_size: int = 1, scope: str = SCOPE,
                   gate: bool = True) -> ExitSimulation:
        """Early exit simulated from a run's stored predictions (`featstore exit-sim`): stability, confidence,
        combined and learned gates (`gate`: where `featstore gate` fitted one), the oracle and the Pareto front,
        every policy counted on the same images; None: the default of each list."""
        from featstore.analytics.queries import describe_population, early_exit
        from featstore.analytics.report import pareto_rows
        from featstore.analytics.selection import fractions, plain, windows

        run_id = self.only_run(run)
        chosen_ks, chosen_thresholds, combined = (windows(ks, "ks"), fractions(thresholds, "thresholds"),
                                                  fractions(combined_thresholds, "combined_thresholds"))
        default = DEFAULT_POLICIES
        policies = replace(default, ks=default.ks if chosen_ks is None else tuple(chosen_ks),
                           thresholds=default.thresholds if chosen_thresholds is None else tuple(chosen_thresholds),
                           combined=default.combined if combined is None else tuple(combined),
                           learned=None if gate else ())
        result = early_exit(self.db, run_id, device, plain(batch_size), policies, scope)
        return ExitSimulation(run_id, result.device, describe_population(result.population.row(0, named=True)),
                              result.simulation, pareto_rows(result.pareto))

    def taps(self, run: str | None = None, scope: str = SCOPE) -> TapGrid:
        """Layer x module probing of a run built with --taps (`featstore taps`): accuracy per block and tap, the
        best pairs and the gain each strategy recovers."""
        from featstore.analytics.queries import tap_gains, tap_grid

        run_id = self.only_run(run)
        grid = tap_grid(self.db, run_id, scope)
        if grid.is_empty():
            raise FeatstoreError(f"run {run_id!r} in {self.db} has no (block, tap) anchors; build the store with ",
                                 Name("taps"))
        table = grid.pivot(on="tap", index="block", values="accuracy", aggregate_function="first").sort("block")
        return TapGrid(run_id, grid, table, tap_gains(self.db, run_id, scope))

    def ddb(self, tau: float | None = None, variant: str | None = None) -> pl.DataFrame:
        """Dependency Depth Bias of every circuit run (`featstore ddb`); None: the macro's own default."""
        given = {"tau": tau, "variant": variant}
        named = [f"{k} := ?" for k, v in given.items() if v is not None]
        return self.sql(f"SELECT * FROM ddb({', '.join(named)})", [v for v in given.values() if v is not None])

    def css(self, id_run: str, ood_run: str, distance: str = CSS_DISTANCES[0], top_n: int = TOP_N) -> pl.DataFrame:
        """Circuit Shift Score between an ID and an OOD circuit run of one model (`featstore css`)."""
        from featstore.analytics.circuit_graphs import circuit_shift

        return circuit_shift(self._one_db("css"), id_run, ood_run, distance, top_n)

    def probe_summary(self, run: str) -> pl.DataFrame:
        """Per anchor of a run: accuracy on its scored images and whether the fit converged (what `featstore
        probe` prints after each run)."""
        from featstore.analytics.selection import probe_summary

        return probe_summary(self.db, run)

    def report(self, out: str | Path | None = None, ks: Ks = None, scope: str = SCOPE,
               min_conf: float = JOINT_MIN_CONF, progress: Callable[[str], None] | None = None,
               figures: str | None = None) -> Path:
        """One self-contained HTML page of every run (`featstore report`), under `out` (default: report/ beside
        the database, wherever the working folder is now); its one-window sections at `window(ks)`. `figures`
        ('png', 'svg' or 'pdf'): every figure also as a file beside the page, for a paper. Returns the page's path,
        absolute."""
        from featstore.analytics.report import check_figures, write_report
        from featstore.analytics.selection import fraction, windows

        db = self._one_db("report")
        if not isinstance(out, str | Path | None):
            raise FeatstoreTypeError("give the report's folder, a path", field="out", value=out)
        out = db.parent / "report" if out is None else Path(out).absolute()
        ks = windows(ks)
        return write_report(db, out, ks, scope, k=self.window(ks), min_conf=fraction(min_conf, "min_conf"),
                            progress=progress, figures=check_figures(figures))

    def _one_db(self, what: str) -> Path:
        if isinstance(self.db, list):
            raise FeatstoreError(f"{what} reads one database; connect to one")
        return self.db


def _statement(query: object) -> str:
    if not isinstance(query, str):
        raise FeatstoreTypeError("give one SQL statement, a string", field="query", value=query)
    return query


def _read_paths(db: str | Path | Sequence[str | Path]) -> Path | list[Path]:
    """The database(s) as absolute paths (read, and reported beside, as the same files whatever the working folder
    later): one path, or a list of them as given."""
    from featstore.analytics.selection import databases

    paths = databases(db)
    return paths[0] if isinstance(db, str | Path) else paths


def stream_rows(db: str | Path | Sequence[str | Path], query: str,
                params: Sequence | dict | None = None) -> Iterator[Rows | pl.DataFrame]:
    """`connect(db).stream_rows(query)` opening the database once (`featstore sql`): a result whose every column is
    a number, text or a boolean as `Rows`, any other as Polars frames; closing it early, or Ctrl-C, cancels it."""
    from featstore.analytics.read_only import stream

    batches = stream(_read_paths(db), _statement(query), params, plain=True)
    try:
        for batch in batches:
            if isinstance(batch, Rows):
                yield batch
            else:
                import polars as pl

                yield pl.from_arrow(batch)
    finally:
        batches.close()


def k_sweep_rows(db: str | Path | Sequence[str | Path], ks: Ks = None, scope: str = SCOPE, min_conf: float = MIN_CONF,
                 runs: Runs = None, band: str = BAND) -> SweepRows:
    """`connect(db).k_sweep_rows(...)` opening the database once (`featstore timeline`)."""
    from featstore.analytics.read_only import k_sweep_rows as sweep_rows
    from featstore.analytics.selection import fraction, run_ids, windows

    return SweepRows(*sweep_rows(_read_paths(db), windows(ks), scope, fraction(min_conf, "min_conf"), run_ids(runs),
                                 band))


def connect(db: str | Path | Sequence[str | Path]) -> Results:
    """A database (or several, as one) read-only: `.sql(query)`, `.runs`, `.timeline(run, image_id)`, and every
    query command's result (`.k_sweep()`, `.compare()`, `.early_exit()`, `.report()`, ...)."""
    return Results(db)


def runs_written(db: str | Path) -> dict[str, str]:
    """Run id -> when it was written, of the runs `db` holds now (none when it does not exist yet): read before a
    probe job, it says when each run the job replaces had been written."""
    from featstore.analytics.selection import runs_written as written

    return written(db)
