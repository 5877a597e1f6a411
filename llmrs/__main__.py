from llmrs.cli import main

main()
