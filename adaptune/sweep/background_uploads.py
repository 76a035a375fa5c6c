"""A run directory's uploads to a bucket store, off the training thread (adaptune.sweep.store.RunStore.run_dir).

A run on a gs:// store trains in a local directory and uploads it whenever it saves its state: at epoch
ends (adaptune.train.state_saves says which) and every `checkpoint_every_steps`. Uploaded in line, each
save stopped the accelerator for as long as the upload took: a BERT-base adapter run's state is 29 MB (its weights and AdamW's two moments), a fused
group of 8 saves 8 of them at once, and a whole model's state is three copies of its weights (1.3 GB for
BERT-base, 4 GB for BERT-large). Here the upload runs on a worker thread while training goes on. What stays true:
- the bucket never holds half a file: each file is one object write, and a state is written locally under a
  temporary name first (core.files.atomic_write), whose files are never uploaded; a state replaced while it
  travels does not tear it, as gcsfs's put_file reads a file's size and bytes through one open handle;
- a kill during an upload leaves the bucket's previous state, from which the run resumes (a little further back);
- an upload's failure is raised by the next request or by `finish()`, where an in-line upload's would have been
  raised a little earlier: a transient one is retried by the shard as before;
- `finish()` waits for every upload, so a run's record, published after its directory closes, never names a
  checkpoint that has not arrived.
Requests coalesce: an upload sends every file as it is when it starts, so one waiting behind the running one
covers any further requests.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class BackgroundUploads:
    """One run directory's uploads, one at a time on a worker thread (the module docstring says what holds)."""

    def __init__(self, upload: Callable[[], None]) -> None:
        self._upload = upload
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-upload")
        self._futures: list[Future[None]] = []

    def request(self) -> None:
        """Upload the directory as it will be when the worker gets to it; raises an earlier upload's failure."""
        self._raise_failure()
        if any(not future.running() and not future.done() for future in self._futures):
            return  # one has not started yet: it will read these files as they are then
        self._futures.append(self._executor.submit(self._upload))

    def finish(self, raise_failure: bool = True) -> None:
        """Wait for every upload; raise the first failure unless told not to (an exception is already on its way)."""
        self._executor.shutdown(wait=True)
        if raise_failure:
            self._raise_failure()

    def _raise_failure(self) -> None:
        done = [future for future in self._futures if future.done()]
        self._futures = [future for future in self._futures if not future.done()]
        for future in done:
            if future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
