from rollyard.cli import main

main()
