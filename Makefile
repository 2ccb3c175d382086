# The two set-up commands of the README. Both install what they need, then run.
.PHONY: demo test test-fast lint-layers setup bench

demo:
	@scripts/setup.sh
	.venv/bin/vllm-sentinel demo

test:
	@scripts/setup.sh --with-tests
	scripts/lint_layers.sh
	VLLM_SENTINEL_REQUIRE_VLLM=1 .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 tests

# unit tests only (no real vLLM server): seconds, for the edit loop
test-fast:
	@scripts/setup.sh --with-tests
	scripts/lint_layers.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "not integration and not packaging" tests

setup:
	@scripts/setup.sh --with-tests

bench:
	@scripts/setup.sh --with-tests
	for b in bench/*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done

# the rooms' import layers (pyproject's [tool.importlinter]); part of test and test-fast
lint-layers:
	@scripts/setup.sh --with-tests
	scripts/lint_layers.sh
