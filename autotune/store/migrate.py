"""Bring an older database up to the current tables: new tables are created, and a column the models
have but the table lacks is added with ALTER TABLE. Only nullable columns are ever added, so a database
written by an older autotune (the committed studies under benchmarks/gpu/ among them) keeps opening and
its rows read as "not recorded" where the column is new."""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from autotune.store.models import Base


def add_missing_columns(engine: Engine) -> list[str]:
    """`table.column` for every column added. Idempotent; a column another process added first is fine."""
    added: list[str] = []
    with engine.begin() as conn:
        insp = inspect(conn)
        for table in Base.metadata.sorted_tables:
            if not insp.has_table(table.name):
                continue
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name in have:
                    continue
                if not col.nullable:
                    raise RuntimeError(f"{table.name}.{col.name} is not nullable: it cannot be added to old rows")
                kind = col.type.compile(dialect=conn.dialect)
                try:
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'))
                except Exception:
                    if col.name not in {c["name"] for c in inspect(conn).get_columns(table.name)}:
                        raise
                added.append(f"{table.name}.{col.name}")
    return added
