"""`python -m tito_agents.testing.fake_vllm`: serve a fake vLLM until interrupted (see `main`)."""

from tito_agents.testing.fake_vllm import main

main()
