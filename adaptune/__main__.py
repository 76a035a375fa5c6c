from adaptune.cli import main

raise SystemExit(main())
