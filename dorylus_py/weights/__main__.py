from dorylus_py.serving.process import exit_process
from dorylus_py.weights.server import main

exit_process(main())
