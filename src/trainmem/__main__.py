from trainmem.cli import main

raise SystemExit(main())
