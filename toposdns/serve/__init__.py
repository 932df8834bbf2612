"""UDP and TCP frontends and the bytes-in, bytes-out responder behind them."""
