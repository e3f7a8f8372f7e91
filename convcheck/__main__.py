from convcheck.cli import main

main()
