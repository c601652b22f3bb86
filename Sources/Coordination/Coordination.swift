// The coordination layer: arbitration, presenters and the control protocol.
