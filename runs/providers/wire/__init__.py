"""What every HTTP model provider shares: the attempt flow, its watchdog, retry signals and the turn accumulator."""
