"""What a person watching `autotune run` sees: a live table on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


class Progress:
    def __init__(self, study: str, objectives: list[str], budget: int, live: bool | None = None):
        self.study = study
        self.objectives = objectives
        self.budget = budget
        self.console = Console(stderr=True, soft_wrap=True)
        self.live_enabled = sys.stderr.isatty() if live is None else live
        self.rows: list[tuple[str, ...]] = []
        self.status = "starting"
        self.current = ""
        self.t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> "Progress":
        if self.live_enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def _render(self) -> Group:
        table = Table(title=f"autotune: {self.study}", expand=False)
        for col in ("#", "role", "state", *self.objectives, "note"):
            table.add_column(col, overflow="fold")
        for row in self.rows[-15:]:
            table.add_row(*row)
        elapsed = time.monotonic() - self.t0
        head = Text(f"{self.current}  {self.status}   [{elapsed / 60:.1f} min]", style="bold")
        return Group(table, head)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def trial_started(self, number: int, role: str, complete: int, flags: list[str]) -> None:
        self.current = f"trial {number} ({role}, {complete}/{self.budget} done)"
        self.status = " ".join(flags) or "(engine defaults)"
        if self._live is None:
            self._plain(f"[trial {number}] {role}: {self.status}")
        self._refresh()

    def phase(self, text: str) -> None:
        self.status = text
        if self._live is None:
            self._plain(f"  {text}")
        self._refresh()

    def trial_finished(self, number: int, role: str, state: str, values: dict[str, float] | None,
                       note: str) -> None:
        cells = [f"{values[o]:.4g}" if values and o in values else "-" for o in self.objectives]
        self.rows.append((str(number), role, state, *cells, note))
        if self._live is None:
            shown = ", ".join(f"{o}={c}" for o, c in zip(self.objectives, cells))
            self._plain(f"[trial {number}] {state}: {shown} {note}".rstrip())
        self._refresh()

    def message(self, text: str) -> None:
        self._plain(text)

    def _plain(self, text: str) -> None:
        """Flags and trial tags contain brackets; they are text, not rich markup."""
        self.console.print(text, markup=False, highlight=False)
