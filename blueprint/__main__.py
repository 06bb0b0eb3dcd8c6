from blueprint._cli import main

raise SystemExit(main())
