from vllm_sentinel.agent.cli.app import main

main()
