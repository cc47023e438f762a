from lota.cli import main

raise SystemExit(main())
