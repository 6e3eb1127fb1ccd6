"""The search's progress: a bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import time


class Progress:
    """A bar on a terminal; elsewhere (a log file, a pipe, CI) one plain line on stderr every
    :data:`PLAIN_EVERY_S` seconds, so a long run is never silent."""

    def __init__(self, budget, done: int):
        import sys

        total = budget.samples if budget.samples is not None else None
        self.budget, self.total = budget, total
        self.t0 = self.last = time.perf_counter()
        self.done0 = done
        self.p = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(
                TextColumn("search"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} samples"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                transient=True,
            )
            self.p.start()
            self.task = self.p.add_task("search", total=total, completed=done, info="")

    def update(self, state) -> None:
        import sys

        now = time.perf_counter()
        rate = (state.samples - self.done0) / max(now - self.t0, 1e-9)
        info = (
            f"best {state.best_step_time * 1e3:.3f} ms  batch mean {state.last_batch_mean * 1e3:.3f} ms  "
            f"{rate:.0f} samples/s"
        )
        if self.p is not None:
            self.p.update(self.task, completed=state.samples, info=info)
        elif now - self.last >= PLAIN_EVERY_S:
            self.last = now
            of = f"/{self.total}" if self.total is not None else ""
            print(f"search: {state.samples}{of} samples, {info}, {now - self.t0:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()


#: seconds between two plain progress lines when stderr is not a terminal
PLAIN_EVERY_S = 10.0
