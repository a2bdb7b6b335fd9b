from dorylus_py.cli import main

raise SystemExit(main())
