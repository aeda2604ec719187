from hvd_train.cli import main

raise SystemExit(main())
