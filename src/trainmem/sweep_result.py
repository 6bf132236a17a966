"""The answer of a comparison of configurations (sweep.py): one row per configuration, printed as one aligned
table, as JSON, as an HTML table in a notebook, and drawn as a plot of peaks (report/plot.py)."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from trainmem.errors import failure_groups, grouped_failures
from trainmem.units import format_bytes


@dataclasses.dataclass(frozen=True)
class DeviceBudget:
    """A device the largest batch is searched on, and what fit would keep free on it."""

    device: Any  # devices.Device
    margin: float
    margin_source: str
    budget_bytes: int

    @property
    def name(self) -> str:
        return self.device.name

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "capacity_bytes": self.device.capacity_bytes, "margin": self.margin,
                "margin_source": self.margin_source, "budget_bytes": self.budget_bytes}


@dataclasses.dataclass(frozen=True)
class LargestBatch:
    best: int | None  # the largest batch that fits (None: not even 1)
    first_miss: int | None  # the smallest found not to fit (None: the search's limit fits)
    how: str  # fit's words: which batch sizes were traced and which predicted
    error: str = ""  # why this device could not be searched (e.g. bf16 on a card without it); the row stands
    failed: tuple[tuple[int, str], ...] = ()  # (batch, why) of candidates whose estimate failed: the search
    # stopped there, so `best` is the largest that fits of those evaluated

    def text(self) -> str:
        if self.error:
            return "n/a"
        if self.best is None:
            return "none"
        return f"{self.best:,}" + ("+" if self.first_miss is None or self.failed else "")

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "first_miss": self.first_miss, "how": self.how,
                **({"error": self.error} if self.error else {}),
                **({"failed": [{"value": v, "error": why} for v, why in self.failed]} if self.failed else {})}


@dataclasses.dataclass(frozen=True)
class SweepRow:
    label: tuple[tuple[str, str], ...]  # (column, value): what tells this configuration from the others
    model: str
    device: str
    setup: Any  # TrainingSetup
    estimate: Any  # Estimate, None when not evaluated or failed
    largest: dict[str, LargestBatch]  # device name -> the largest batch that fits it
    status: str = "estimated"  # estimated | not evaluated | failed
    error: str | None = None  # why it failed, in one line

    @property
    def text_label(self) -> str:
        return ", ".join(value if column == "model" else f"{column} {value}" for column, value in self.label)

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        out = {"label": self.text_label, "model": self.model, "values": dict(self.label), "device": self.device,
               "status": self.status, "error": self.error, "setup": self.setup.to_dict(),
               "peak": None, "breakdown": None, "capacity_bytes": None, "fits": None,
               "largest_batch": {name: found.to_dict() for name, found in self.largest.items()}}
        if est is not None:
            data = est.to_dict()
            out.update(peak={**data["peak"], "process_bytes_high": est.process_bytes_high},
                       breakdown=data["breakdown"], capacity_bytes=est.device.capacity_bytes, fits=est.fits)
        return out


def _peak_columns(rows: tuple[SweepRow, ...]) -> list[tuple[str, str]]:
    """(heading, Estimate attribute): a CPU's tensors and peak RSS, a GPU's allocated, reserved and nvidia-smi."""
    from trainmem.targets import report_words

    words = {report_words(row.estimate.device) for row in rows if row.estimate is not None}
    if len(words) == 1:  # one target: its own columns
        return list(words.pop().sweep_columns)
    return [("allocated (CPU: tensors)", "allocated_bytes"), ("reserved", "reserved_bytes"),
            ("process", "process_bytes")]


@dataclasses.dataclass(frozen=True)
class SweepResult:
    columns: tuple[str, ...]  # the configuration columns (model, then each swept key as typed)
    rows: tuple[SweepRow, ...]
    devices: tuple[DeviceBudget, ...]  # where the largest batch was searched
    seconds: float
    time_limit: float | None = None
    warnings: tuple[str, ...] = ()

    @property
    def estimated(self) -> tuple[SweepRow, ...]:
        return tuple(row for row in self.rows if row.estimate is not None)

    @property
    def failed(self) -> tuple[SweepRow, ...]:
        """The configurations that could not be evaluated, each with its reason in `error`."""
        return tuple(row for row in self.rows if row.status == "failed")

    @property
    def failures(self) -> list[tuple[str, str]]:
        """(configuration label, reason) of each failed configuration."""
        return [(row.text_label or row.model, row.error or "") for row in self.failed]

    def table(self) -> list[list[str]]:
        """The rows as text cells, the headings first."""
        peaks = _peak_columns(self.rows)
        head = list(self.columns) + [name for name, _ in peaks] + ["fits"]
        head += [f"largest batch {budget.name}" for budget in self.devices]
        out = [head]
        for row in self.rows:
            cells = [value for _, value in row.label]
            est = row.estimate
            if est is None:
                cells += [row.status] + [""] * (len(head) - len(cells) - 1)
            else:
                cells += [format_bytes(getattr(est, attr)) if getattr(est, attr) is not None else "—"
                          for _, attr in peaks]
                cells += ["yes" if est.fits else "no"]
                cells += [row.largest[budget.name].text() for budget in self.devices]
            out.append(cells)
        return out

    def __str__(self) -> str:
        from trainmem.report.style import table as aligned

        table = self.table()
        align = "l" * len(self.columns) + "r" * (len(table[0]) - len(self.columns))
        models = list(dict.fromkeys(row.model for row in self.rows))
        devices = list(dict.fromkeys(row.device for row in self.rows))
        lines = [f"trainmem compare — {len(self.rows)} configuration{'s' * (len(self.rows) != 1)} of "
                 f"{', '.join(models)} on {', '.join(devices)}", *aligned(table, align), ""]
        return "\n".join(lines + [f"  {note}" for note in self._notes()]).rstrip()

    def _notes(self) -> list[str]:
        notes = ["peaks as trainmem estimate reports them; fits: the estimate's verdict for its device"]
        if self.devices:
            budgets = ", ".join(f"{b.name} {format_bytes(b.budget_bytes)} of {format_bytes(b.device.capacity_bytes)}"
                                for b in self.devices)
            notes.append(f"largest batch: trainmem fit's search on each device; a batch fits when its high estimate "
                         f"is within the capacity less the margin: {budgets}; '+': the search's limit fits")
            margins = {f"{b.margin:.0%} from {b.margin_source}" for b in self.devices}
            notes += [f"margin {margin}" for margin in sorted(margins)]
        skipped = sum(row.status == "not evaluated" for row in self.rows)
        if skipped:
            notes.append(f"{skipped} configuration{'s' * (skipped != 1)} not evaluated: the time limit "
                         f"({self.time_limit:g} s) was reached")
        notes += grouped_failures(self.failures, "configurations", limit=10)
        notes += [f"n/a: {row.text_label or row.model}, {name}: {found.error}" for row in self.rows
                  for name, found in row.largest.items() if found.error]
        notes += [f"largest batch {row.text_label or row.model}, {name}: batch {value:,} failed: {why} (the answer, "
                  f"{found.best:,}+, is the largest that fits of those evaluated)" for row in self.rows
                  for name, found in row.largest.items() for value, why in found.failed if found.best is not None]
        return notes

    def to_dict(self) -> dict[str, Any]:
        from trainmem import __version__

        return {"trainmem_version": __version__, "columns": list(self.columns),
                "devices": [budget.to_dict() for budget in self.devices],
                "configurations": len(self.rows), "estimated": len(self.estimated),
                "not_evaluated": sum(row.status == "not evaluated" for row in self.rows),
                "failed": len(self.failed), "failures": failure_groups(self.failures), "time_limit_s": self.time_limit,
                "rows": [row.to_dict() for row in self.rows], "warnings": list(self.warnings)}

    def _repr_html_(self) -> str:
        table = self.table()
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in table[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in table[1:])
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in self._notes())
        return (f"<div><p><b>{html.escape(str(self).splitlines()[0])}</b></p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table><ul>{notes}</ul></div>")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def plot_data(self) -> tuple[list[str], dict[str, list[int | None]], dict[str, int]]:
        """What report.plot.write_peaks_plot draws: a label per estimated configuration, a series of peak bytes
        per peak column (None where a column does not apply, a CPU's reserved), the devices' capacities."""
        rows = self.estimated
        labels = [row.text_label or row.model for row in rows]
        series = {name: [getattr(row.estimate, attr) for row in rows] for name, attr in _peak_columns(rows)}
        series = {name: values for name, values in series.items() if None not in values}  # CPU rows: no reserved
        capacities = {row.estimate.device.name: row.estimate.device.capacity_bytes for row in rows}
        return labels, series, capacities

    def write_plot(self, path: str, where: str = "--plot") -> None:
        """The peaks of the estimated configurations as a grouped bar chart (.png or .svg; needs matplotlib)."""
        from trainmem.errors import SetupError
        from trainmem.report.plot import write_peaks_plot

        if not self.estimated:
            raise SetupError("expected at least one estimated configuration to plot, got none", where=where)
        labels, series, capacities = self.plot_data()
        title = f"Peak memory of {len(labels)} configuration{'s' * (len(labels) != 1)}"
        write_peaks_plot(labels, series, capacities, path, title, where=where)
