# The two commands of the README's Quick start.
.PHONY: demo test bootstrap lint

demo: bootstrap
	.venv/bin/eo demo

test:
	scripts/test.sh

bootstrap:
	scripts/bootstrap.sh

lint:
	.venv/bin/ruff check airflow_provider_eo tests dags bench && .venv/bin/mypy
