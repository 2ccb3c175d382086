from vllm_sentinel.agent.cli import main

main()
