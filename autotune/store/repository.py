"""Reads and writes autotune's evidence tables. One object per storage URL; every write is its own
short transaction so that a SIGKILL at any instant leaves completed trials intact."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import Row, create_engine, delete, inspect, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, load_only

from autotune.errors import UserError
from autotune.redact import Redactor, redact_flags
from autotune.store.migrate import migrate
from autotune.store.reconnect import wait_to_connect
from autotune.store.models import (Base, ConfirmationRecord, LimitRecord, PredictionRecord,
                                   ProcessRecord, SeriesRecord, StudyRecord,
                                   TrialRecord, WorkloadProfileRecord, utcnow)


def sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


def make_engine(url: str) -> Engine:
    try:
        if url.startswith("sqlite"):
            return create_engine(url, connect_args={"timeout": 30})
        return wait_to_connect(create_engine(url, pool_pre_ping=True))   # a restart: store/reconnect.py
    except Exception as e:  # bad URL, missing driver
        raise UserError(f"storage {url!r}: {e}") from None


def storage_exists(url: str) -> bool:
    """Without creating anything: does this storage already hold autotune tables?"""
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return False
    try:
        eng = make_engine(url)
        with eng.connect() as conn:
            return inspect(conn).has_table(StudyRecord.__tablename__)
    except UserError:
        raise
    except Exception:
        return False


# Columns that hold text a server or a user wrote (flags, commands, log lines, error details): scrubbed of
# the shapes of secrets on the way in (autotune/redact.py), whoever the caller is.
_FREE_TEXT = frozenset({"engine_command", "fixed_flags", "spec", "flags", "detail", "log_tail", "workload"})


def _scrubbed(fields: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    out = dict(fields)
    for key in _FREE_TEXT & out.keys():
        value = out[key]
        out[key] = redact_flags(value) if key in ("engine_command", "fixed_flags", "flags") and isinstance(
            value, list) else value
        out[key] = redactor.obj(out[key])
    return out


def storage_failure(exc: BaseException) -> str | None:
    """One line for an error that means the storage (or the disk under it) cannot be written: a full
    or read-only disk, a file size limit, SQLite's I/O errors. None for anything else (a bug)."""
    import errno

    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        text = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        if any(w in text.lower() for w in ("disk", "full", "readonly", "read-only", "unable to open")):
            return text
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS):
        return f"{exc.strerror} ({exc.filename})" if exc.filename else str(exc.strerror)
    return None


class ResultStore:
    def __init__(self, url: str, create: bool = True, redactor: Redactor | None = None):
        self.url = url
        # Known secret values of the study (Redactor.for_engine); the shapes of unknown ones are scrubbed anyway.
        self.redactor = redactor or Redactor()
        path = sqlite_path(url)
        if path is not None:
            if not create and not path.is_file():
                raise UserError(f"storage {url!r}: no such database file")
            path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(url)
        if create:
            Base.metadata.create_all(self.engine)
        elif not storage_exists(url):
            raise UserError(f"storage {url!r} holds no autotune study")
        else:
            Base.metadata.create_all(self.engine)   # tables newer than the database (confirmations)
        migrate(self.engine)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # studies ---------------------------------------------------------------------------------------
    def study(self, name: str) -> StudyRecord | None:
        with self.session() as s:
            return s.scalar(select(StudyRecord).where(StudyRecord.name == name))

    def study_names(self) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(StudyRecord.name).order_by(StudyRecord.id)))

    def resolve_study(self, name: str | None) -> StudyRecord:
        """The named study, or the only one in the storage."""
        names = self.study_names()
        if name is None:
            if len(names) == 1:
                name = names[0]
            elif not names:
                raise UserError(f"storage {self.url!r} holds no study")
            else:
                raise UserError(f"storage holds several studies ({', '.join(names)}): pick one with --study-name")
        rec = self.study(name)
        if rec is None:
            raise UserError(f"no study named {name!r} in {self.url!r} (there: {', '.join(names) or 'none'})")
        return rec

    def ensure_study(self, **fields: Any) -> StudyRecord:
        """Create the study row, or check that an existing one tunes the same space."""
        with self.session() as s:
            rec = s.scalar(select(StudyRecord).where(StudyRecord.name == fields["name"]))
            if rec is None:
                rec = StudyRecord(**_scrubbed(fields, self.redactor))
                s.add(rec)
                s.commit()
                return rec
            if rec.space_hash != fields["space_hash"]:
                raise UserError(f"study {rec.name!r} in {self.url} was created with another search space; "
                                f"use a new study name or storage")
            return rec

    # the workload's profile ------------------------------------------------------------------------
    def save_workload_profile(self, study_id: int, profile: dict[str, Any]) -> None:
        with self.session() as s:
            rec = s.scalar(select(WorkloadProfileRecord).where(WorkloadProfileRecord.study_id == study_id))
            if rec is None:
                s.add(WorkloadProfileRecord(study_id=study_id, profile=profile))
            else:
                rec.profile = profile
            s.commit()

    def workload_profile(self, study_id: int) -> dict[str, Any] | None:
        """None also for a database written before profiles were stored (no such table)."""
        with self.session() as s:
            if not inspect(s.connection()).has_table(WorkloadProfileRecord.__tablename__):
                return None
            rec = s.scalar(select(WorkloadProfileRecord).where(WorkloadProfileRecord.study_id == study_id))
            return None if rec is None else rec.profile

    # trials ----------------------------------------------------------------------------------------
    def _upsert(self, model: type, key: dict[str, Any], fields: dict[str, Any]) -> Any:
        """Insert the row with `key`, or update its `fields`, in one short transaction; free text is
        scrubbed of secrets whoever writes it."""
        fields = _scrubbed(fields, self.redactor)
        with self.session() as s:
            rec = s.scalar(select(model).filter_by(**key))
            if rec is None:
                rec = model(**key, **fields)
                s.add(rec)
            else:
                for k, v in fields.items():
                    setattr(rec, k, v)
            s.commit()
            return rec

    def save_trial(self, study_id: int, number: int, **fields: Any) -> TrialRecord:
        """Insert or update the evidence of one trial (a trial is written when it starts and when it ends)."""
        return self._upsert(TrialRecord, {"study_id": study_id, "number": number}, fields)

    def trials(self, study_id: int) -> list[TrialRecord]:
        with self.session() as s:
            return list(s.scalars(select(TrialRecord).where(TrialRecord.study_id == study_id)
                                  .order_by(TrialRecord.number)))

    # What is read on every ask, tell or scrape reads only its own columns: a full row carries several KB of
    # evidence (steps, metrics, the log's tail) to decode, and a study of a few hundred trials read whole
    # on every trial held the daemon's lock for tens of milliseconds (benchmarks/scale/RESULTS.md, §10).
    def trial_times(self, study_id: int) -> list[Row[Any]]:
        """Each trial's number, state, cause, start, finish and client use, in trial order (attribute
        access like a record's): wall times, counts and the scrape's figures."""
        with self.session() as s:
            return list(s.execute(select(TrialRecord.number, TrialRecord.state, TrialRecord.cause,
                                         TrialRecord.started_at, TrialRecord.finished_at, TrialRecord.client)
                                  .where(TrialRecord.study_id == study_id).order_by(TrialRecord.number)))

    def trials_between(self, study_id: int, start: dt.datetime, end: dt.datetime) -> list[TrialRecord]:
        """The trials whose recorded run meets [start, end) (started before `end`, not finished by
        `start`), with only what the overlap bookkeeping reads loaded (tuner/sharing.py)."""
        cols = (TrialRecord.number, TrialRecord.lease, TrialRecord.cause, TrialRecord.started_at,
                TrialRecord.finished_at, TrialRecord.overlapped, TrialRecord.measurement_flags)
        with self.session() as s:
            return list(s.scalars(select(TrialRecord).options(load_only(*cols))
                                  .where(TrialRecord.study_id == study_id, TrialRecord.started_at < end,
                                         or_(TrialRecord.finished_at.is_(None), TrialRecord.finished_at > start))
                                  .order_by(TrialRecord.number)))

    def brackets(self, study_id: int) -> list[Any]:
        """The capacity bracket (highest met, lowest broken load) of each measured trial, read out of its
        capacity document by the database."""
        with self.session() as s:
            return list(s.scalars(select(TrialRecord.capacity["bracket"])
                                  .where(TrialRecord.study_id == study_id, TrialRecord.state == "ok")
                                  .order_by(TrialRecord.number)))

    def trial(self, study_id: int, number: int) -> TrialRecord | None:
        with self.session() as s:
            return s.scalar(select(TrialRecord).where(TrialRecord.study_id == study_id,
                                                      TrialRecord.number == number))

    def held_cores(self, host: str) -> set[int]:
        """The CPU cores that the leases of this host's running trials hold, across studies (a trial's
        lease is stored when it starts): what the warm start's ranking keeps off (tuner/twin_pool.py)."""
        with self.session() as s:
            leases = s.scalars(select(TrialRecord.lease).where(TrialRecord.state == "running",
                                                               TrialRecord.host == host))
            return {int(c) for lease in leases if lease for c in lease.get("cores") or ()}

    def mark_abandoned(self, study_id: int, numbers: set[int]) -> int:
        """Trials a killed process left unfinished are recorded as interrupted: 'running' ones, and an
        early-stopped or duplicate one whose tell never reached Optuna (re-queued like the rest)."""
        n = 0
        with self.session() as s:
            for rec in s.scalars(select(TrialRecord).where(TrialRecord.study_id == study_id,
                                                           TrialRecord.state.in_(("running", "stopped",
                                                                                  "duplicate")))):
                if rec.number in numbers:
                    rec.state, rec.cause, rec.finished_at = "interrupted", "interrupted", utcnow()
                    rec.detail = "autotune was killed during this trial; its parameters were run again"
                    n += 1
            s.commit()
        return n

    # confirmations ---------------------------------------------------------------------------------
    def save_confirmation(self, **fields: Any) -> ConfirmationRecord:
        """Insert or replace the repeat of one trial in one round."""
        key = {"trial_id": fields.pop("trial_id"), "round": fields.pop("round")}
        return self._upsert(ConfirmationRecord, key, fields)

    def stamp_spread_rule(self, study_id: int, new: str, old: str) -> str:
        """Fix the study's spread rule (tuner/verdict.py) before a confirmation row is stored, and return
        the rule in force: `new` for a study storing its first round, `old` for one whose rounds were
        stored before the stamp existed. A stamped rule is never changed, so a verdict cannot be re-read
        under another rule once its numbers are known."""
        with self.session() as s:
            has_rows = s.scalar(select(ConfirmationRecord.id).where(ConfirmationRecord.study_id == study_id)
                                .limit(1)) is not None
            s.execute(update(StudyRecord).where(StudyRecord.id == study_id, StudyRecord.spread_rule.is_(None))
                      .values(spread_rule=old if has_rows else new))
            s.commit()
            return str(s.scalar(select(StudyRecord.spread_rule).where(StudyRecord.id == study_id)))

    def confirmations(self, study_id: int) -> list[ConfirmationRecord]:
        with self.session() as s:
            return list(s.scalars(select(ConfirmationRecord).where(ConfirmationRecord.study_id == study_id)
                                  .order_by(ConfirmationRecord.round, ConfirmationRecord.position)))

    # what the search policy learned (tuner/policy.py) ---------------------------------------------
    def add_limit(self, study_id: int, doc: dict[str, Any]) -> None:
        with self.session() as s:
            s.add(LimitRecord(study_id=study_id, trial_number=doc.get("trial"), param=doc["param"], op=doc["op"],
                              value=float(doc["value"]), reason=doc.get("reason", ""), when=dict(doc.get("when") or {})))
            s.commit()

    def limits(self, study_id: int) -> list[dict[str, Any]]:
        with self.session() as s:
            rows = s.scalars(select(LimitRecord).where(LimitRecord.study_id == study_id).order_by(LimitRecord.id))
            return [{"param": r.param, "op": r.op, "value": r.value, "reason": r.reason, "trial": r.trial_number,
                     "when": r.when or {}} for r in rows]

    def save_prediction(self, study_id: int, number: int, rank: int | None, predicted: dict[str, Any],
                        source: str = "twin") -> None:
        with self.session() as s:
            rec = s.scalar(select(PredictionRecord).where(PredictionRecord.study_id == study_id,
                                                          PredictionRecord.number == number))
            if rec is None:
                s.add(PredictionRecord(study_id=study_id, number=number, source=source, rank=rank, predicted=predicted))
            else:
                rec.rank, rec.predicted, rec.source = rank, predicted, source
            s.commit()

    def predictions(self, study_id: int) -> dict[int, PredictionRecord]:
        with self.session() as s:
            return {r.number: r for r in s.scalars(select(PredictionRecord)
                                                   .where(PredictionRecord.study_id == study_id))}

    # raw series ------------------------------------------------------------------------------------
    def add_series(self, trial_id: int, kind: str, data: list[Any]) -> None:
        with self.session() as s:
            s.add(SeriesRecord(trial_id=trial_id, kind=kind, data=data))
            s.commit()

    def series(self, trial_id: int, kind: str) -> list[Any] | None:
        with self.session() as s:
            rec = s.scalar(select(SeriesRecord).where(SeriesRecord.trial_id == trial_id, SeriesRecord.kind == kind))
            return None if rec is None else rec.data

    def keep_series_only_for(self, study_id: int, trial_ids: set[int]) -> None:
        with self.session() as s:
            ids = select(TrialRecord.id).where(TrialRecord.study_id == study_id)
            s.execute(delete(SeriesRecord).where(SeriesRecord.trial_id.in_(ids),
                                                 SeriesRecord.trial_id.not_in(trial_ids)))
            s.commit()

    # launched processes ----------------------------------------------------------------------------
    def register_process(self, **fields: Any) -> int:
        with self.session() as s:
            rec = ProcessRecord(**fields)
            s.add(rec)
            s.commit()
            return rec.id

    def forget_process(self, record_id: int) -> None:
        with self.session() as s:
            s.execute(delete(ProcessRecord).where(ProcessRecord.id == record_id))
            s.commit()

    def processes(self, study_name: str) -> Iterator[ProcessRecord]:
        with self.session() as s:
            yield from list(s.scalars(select(ProcessRecord).where(ProcessRecord.study_name == study_name)))
