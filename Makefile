# The commands the README names. `make test` is the line CI runs (.ci/run), with FINETUNE_DATA_DIR
# and HF_HUB_OFFLINE=1 set as in the README's quick start.
.PHONY: test lint benchmark

test:
	python -m pytest tests

lint:
	ruff check . && ruff format --check .

benchmark:
	@echo "GPU benchmarks run on a GPU machine from the project root, writing under --out DIR:"
	@echo "  bash benchmarks/run.sh COMMAND --out DIR [ARGS]    (bash benchmarks/run.sh help lists the commands)"
	@echo "e.g.  bash benchmarks/run.sh speed --out benchmarks/<gpu>-<date> gpt2-medium 8 20 plain finetune"
	@echo "Staging an offline GPU machine and naming the folder: benchmarks/README.md"
