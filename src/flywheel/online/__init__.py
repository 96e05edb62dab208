"""Real-time RL: serving, feedback, the online learner, the gate, deploys (docs/online.md)."""
