# The two commands of the README need no set-up: they install what they need.
.PHONY: demo local test drill chaos scale model-check model-check-full fuzz bench bench-against build invoke deploy check fmt clippy emulator-start emulator-stop clean

demo: ## Run the main job end to end on the local emulator
	scripts/demo.sh

local: ## The worker and dispatcher on the local emulator until Ctrl-C; jobctl's settings in .emulator/local.env
	scripts/local.sh

test: ## Lint the template and run every test (emulator started and stopped here)
	scripts/test.sh

drill: ## The recovery drill on the emulator, with its timeline
	scripts/drill.sh

chaos: ## Fault-injection simulation, 10,000 jobs, every fault kind (SEED=1 SEEDS=1 JOBS=10000)
	cargo run --release --example chaos -- --seed $(or $(SEED),1) --seeds $(or $(SEEDS),1) --jobs $(or $(JOBS),10000)

scale: ## A burst of 100,000 jobs, 1,000 concurrent invocations, a rate-limited provider (SEED=1 JOBS=100000); then a tenant's trickle behind another's burst of 50,000, urgent jobs behind a backlog, and a producer's trickle behind another producer rotating a thousand tenants; then a mixed backlog through each way of picking a job's path
	cargo run --release --example chaos -- --scale --seed $(or $(SEED),1) --jobs $(or $(JOBS),100000)
	cargo run --release --example chaos -- --tenants --seed $(or $(SEED),1)
	cargo run --release --example chaos -- --urgent --seed $(or $(SEED),1)
	cargo run --release --example chaos -- --mixed --seed $(or $(SEED),1)
	cargo run --release --example chaos -- --producers --seed $(or $(SEED),1)

model-check: ## The ledger protocol over every interleaving within the test bound, then each property's mutation (VERIFICATION.md; minutes)
	cargo run --release --example model

model-check-full: ## The same within the full bound (2 h 6 min when last measured, several GB of memory)
	cargo run --release --example model -- --full

fuzz: ## Each fuzz target for FUZZ_SECONDS (default 600) with cargo-fuzz on nightly
	scripts/fuzz.sh

bench: ## Benchmarks (release build; never part of `make test`)
	scripts/bench.sh

bench-against: ## Instructions per DynamoDB request here against another commit's, by callgrind (AGAINST=<commit>; needs valgrind)
	scripts/bench-against.sh $(or $(AGAINST),$(error AGAINST=<commit> is required))

build: ## The deployable arm64 zips (cargo-lambda from PyPI): target/lambda/{worker,reconciler,dispatcher}/bootstrap.zip
	scripts/build.sh

deploy: ## sam build + sam deploy --guided (the SAM CLI from PyPI; needs an AWS account)
	scripts/deploy.sh

invoke: ## A sample event through cargo-lambda's runtime emulator, on the local emulator (EVENT=events/...)
	scripts/invoke.sh

check: ## Formatting and lints, as CI runs them
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

fmt:
	cargo fmt --all

clippy:
	cargo clippy --all-targets -- -D warnings

emulator-start: ## Start the emulator with the local resources, and leave it running (.emulator/lambda.env)
	scripts/emulator.sh start
	scripts/emulator.sh local

emulator-stop:
	scripts/emulator.sh stop

clean:
	scripts/emulator.sh stop
	rm -rf .venv .venv-sam .emulator target
