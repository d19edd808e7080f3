# The two commands of the README's Quick start, and the fast tier for every change.
.PHONY: demo test check bootstrap lint contracts

demo: bootstrap
	.venv/bin/eo demo

# Everything, against the real local services (the README's test command, CI).
test:
	scripts/test.sh

# The fast tier (a few minutes, no Kafka, Spark or PostgreSQL): lint, types, the import
# contracts, the unit tests and the ledger integration tests on SQLite.
check: lint contracts
	.venv/bin/pytest -q --timeout=300 tests/unit tests/integration/ledger -m "not postgres"

bootstrap:
	scripts/bootstrap.sh

lint:
	.venv/bin/ruff check airflow_provider_eo tests dags bench && .venv/bin/mypy

# Which package may import which: pyproject.toml [tool.importlinter].
contracts:
	.venv/bin/lint-imports --no-cache --no-logo
