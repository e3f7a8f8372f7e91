"""What the tests share: the CLI runner and shared runs (helpers), hooks planted through --hook, release targets."""
