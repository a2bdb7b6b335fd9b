from dorylus_py.weights.server import main

raise SystemExit(main())
