"""Progress of a long read on stderr: a bar rewritten in place on a terminal, a plain line every
PLAIN_EVERY_S otherwise (a log, CI), and a last line when done. Threads report to it at once."""

from __future__ import annotations

import sys
import threading
import time

BAR_WIDTH = 30
TTY_EVERY_S = 0.2
PLAIN_EVERY_S = 10.0


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def gigabytes(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count < 100e9 else f"{count / 1e9:.0f} GB"


class Progress:
    """Bytes and shards read of a known total."""

    def __init__(self, total_bytes: int, shards: int, stream=None, clock=time.monotonic):
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._every = TTY_EVERY_S if self._tty else PLAIN_EVERY_S
        self._total, self._shards, self._clock = max(total_bytes, 1), shards, clock
        self._start = self._last = clock()
        self._lock = threading.Lock()
        self._open_line = False  # a bar is drawn and no newline ends it yet
        self.bytes = self.shards_done = 0

    def advance(self, count: int) -> None:
        """`count` more bytes read (fewer, when a read starts again)."""
        with self._lock:
            self.bytes += count
            if self._clock() - self._last >= self._every:
                self._show(final=False)

    def shard_done(self) -> None:
        with self._lock:
            self.shards_done += 1

    def finish(self) -> None:
        with self._lock:
            self._show(final=True)

    def abandon(self) -> None:
        """The read failed: end the bar's line, so the error that follows has its own."""
        with self._lock:
            if self._open_line:
                print(file=self._stream, flush=True)
                self._open_line = False

    def line(self, final: bool = False) -> str:
        elapsed = max(self._clock() - self._start, 1e-6)
        fraction = min(self.bytes / self._total, 1.0)
        rate = self.bytes / elapsed
        left = "done" if final else f"ETA {duration((self._total - self.bytes) / max(rate, 1))}"
        text = (
            f"{gigabytes(self.bytes)} of {gigabytes(self._total)}, {self.shards_done} of "
            f"{self._shards} shards, {rate / 1e6:.0f} MB/s, {left}"
        )
        if not self._tty:
            return f"read {100 * fraction:.0f}%: {text}"
        filled = int(BAR_WIDTH * fraction)
        return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * fraction:3.0f}% {text}"

    def _show(self, final: bool) -> None:
        self._last = self._clock()
        if self._tty:
            end = "\n" if final else ""
            print("\r\033[K" + self.line(final), end=end, file=self._stream, flush=True)
            self._open_line = not final
        else:
            print(self.line(final), file=self._stream, flush=True)
