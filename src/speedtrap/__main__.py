from speedtrap.cli import main

main()
