"""The `finetune` commands, one module each: its parser (`add_parser`, registered by finetune/cli.py)
and its body (`execute`), beside the library modules it calls. `shared` holds what several read."""
