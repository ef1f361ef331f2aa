"""Where the enforced quotas come from, and how the sources combine into one QuotaStore.

Three sources, layered (later wins):

1. ``imported`` -- the cluster's own client quotas (DescribeClientQuotas upstream), when import is on, so
   quotas operators already set in Kafka are enforced at the proxy.
2. ``file`` -- ``quotas.entities`` in the YAML file, replaced on every successful reload.
3. ``api`` -- what admins altered through the proxy's AlterClientQuotas (``kafka-configs.sh
   --bootstrap-server <proxy>``). Kept in the state file so it survives a restart. A removal through the
   API is remembered as a tombstone, so ``--delete-config`` really removes the quota even when the file
   or the cluster also sets it; editing the file does not resurrect it.

Why layered rather than one store that everybody writes: a reload of the file must not wipe what admins set
through the API, and the import must not overwrite either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from config.load import ConfigError
from quotas.entities import DEFAULT, EntityName, QuotaEntity, QuotaStore

log = logging.getLogger(__name__)

Quotas = dict[QuotaEntity, dict[str, float]]
ApiLayer = dict[QuotaEntity, dict[str, float | None]]


class StateFileError(ConfigError):
    """The state file exists but cannot be used; the message names the file and the reason."""


def _name_to_json(name: EntityName) -> str | None:
    return None if name is None else ("<default>" if name is DEFAULT else name)


def _name_from_json(name: str | None) -> EntityName:
    return None if name is None else (DEFAULT if name == "<default>" else name)


class QuotaSources:
    """Keeps the three layers and pushes their combination into ``store`` after every change."""

    def __init__(
        self,
        store: QuotaStore,
        state_file: str | Path | None = None,
        on_alter: Callable[[QuotaEntity, dict[str, float | None]], None] | None = None,
    ) -> None:
        self.store = store
        self.state_file = Path(state_file) if state_file else None
        self.imported: Quotas = {}
        self.file: Quotas = {}
        self.api: ApiLayer = {}
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the state file as last read or written
        self.on_alter = on_alter
        """Told of every entity's new API layer after an alter here (the fleet publishes it to its members)."""
        if self.state_file is not None and self.state_file.exists():
            self.api = self._read_state(self.state_file)
            self._seen = self._stamp()

    # ------------------------------------------------------------------------------------------ layers

    def set_file(self, quotas: Quotas) -> None:
        self.file = {e: dict(q) for e, q in quotas.items()}
        self._apply()

    def set_imported(self, quotas: Quotas) -> None:
        self.imported = {e: dict(q) for e, q in quotas.items()}
        self._apply()

    def alter(self, entity: QuotaEntity, ops: Mapping[str, float | None]) -> None:
        """One validated AlterClientQuotas entry (``None`` = remove); persisted before it takes effect."""
        if self.state_file is None:
            self.api = self._altered(self.api, entity, ops)
        else:  # other processes (workers) share the file: read, change and write it under their common lock
            with self._locked():
                current = self._read_state(self.state_file) if self.state_file.exists() else {}
                new_api = self._altered(current, entity, ops)
                self._write_state(self.state_file, new_api)
                self._seen = self._stamp()
            self.api = new_api
        self._apply()
        if self.on_alter is not None:
            self.on_alter(entity, dict(self.api[entity]))

    def set_api_entity(self, entity: QuotaEntity, layer: Mapping[str, float | None]) -> bool:
        """An entity's API layer as another fleet member altered it (the fleet's compacted topic holds the last
        one per entity, in one order for every member). Persisted like a local alter; True when it changed."""
        layer = dict(layer)
        if self.api.get(entity) == layer:
            return False
        new_api = dict(self.api)
        new_api[entity] = layer
        if self.state_file is not None:
            with self._locked():
                self._write_state(self.state_file, new_api)
                self._seen = self._stamp()
        self.api = new_api
        self._apply()
        return True

    @staticmethod
    def _altered(api: ApiLayer, entity: QuotaEntity, ops: Mapping[str, float | None]) -> ApiLayer:
        layer = dict(api.get(entity, {}))
        layer.update(ops)
        new_api = dict(api)
        new_api[entity] = layer
        return new_api

    def refresh(self) -> bool:
        """Take in what another process (a worker on this host) altered in the state file since it was last read
        or written here; a stat per call, a read only on change. True when the quotas changed."""
        if self.state_file is None:
            return False
        stamp = self._stamp()
        if stamp == self._seen or stamp is None:
            return False
        try:
            with self._locked():
                api = self._read_state(self.state_file)
                self._seen = self._stamp()
        except StateFileError as exc:  # a broken file: keep the quotas in force, say so once per change
            log.warning("%s; the quotas altered earlier stay in force", exc)
            self._seen = stamp
            return False
        if api == self.api:
            return False
        self.api = api
        self._apply()
        return True

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.state_file.stat()  # type: ignore[union-attr]
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An advisory lock beside the state file, held while it is read-modified-written: two workers altering
        different entities at once must both be kept, not the last writer's view only."""
        lock_path = self.state_file.with_name(self.state_file.name + ".lock")  # type: ignore[union-attr]
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def effective(self) -> Quotas:
        out: Quotas = {}
        for layer in (self.imported, self.file):
            for entity, quotas in layer.items():
                out.setdefault(entity, {}).update(quotas)
        for entity, ops in self.api.items():
            merged = out.setdefault(entity, {})
            for key, value in ops.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
        return {e: q for e, q in out.items() if q}

    def _apply(self) -> None:
        want = self.effective()
        have = self.store.entities()
        for entity, quotas in have.items():
            for key in quotas:
                if key not in want.get(entity, {}):
                    self.store.remove(entity, key)
        for entity, quotas in want.items():
            for key, value in quotas.items():
                self.store.set(entity, key, value)

    # ------------------------------------------------------------------------------------------ state file

    @staticmethod
    def _read_state(path: Path) -> ApiLayer:
        try:
            doc = json.loads(path.read_text())
            out: ApiLayer = {}
            for item in doc["entities"]:
                entity = QuotaEntity(_name_from_json(item.get("user")), _name_from_json(item.get("client-id")))
                out[entity] = {str(k): (None if v is None else float(v)) for k, v in item["quotas"].items()}
            return out
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateFileError(f"quotas.state_file {path}: cannot be read ({type(exc).__name__}: {exc})") from None

    @staticmethod
    def _write_state(path: Path, api: ApiLayer) -> None:
        """Atomically: a crash leaves the old file or the new one, never half of one."""
        doc = {
            "version": 1,
            "entities": [
                {"user": _name_to_json(e.user), "client-id": _name_to_json(e.client_id), "quotas": q}
                for e, q in api.items()
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
