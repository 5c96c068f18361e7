from model_cache.cli import main

raise SystemExit(main())
