# Read by every `bash -c` that a local tritonserver runs (its BASH_ENV, set by
# infergate/triton/local.py): the Python backend starts each model's stub so, with
# `bash -c "exec .../triton_python_backend_stub <model.py> ..."`. Where that model.py
# raises its threads back to the server's CPU priority once its model is built (it names
# INFERGATE_STUB_NICE: infergate/triton/python_backend_onnx.py), the shell lowers its own
# priority by INFERGATE_STUB_NICE before it becomes the stub, so the stub's start (the
# interpreter, numpy, ONNX Runtime) and the model's build run below inference. A model.py
# that would not raise them back (another model's, or one converted before) starts at
# the server's priority as before. Set only where that raise is allowed (CAP_SYS_NICE).
if [ -n "${INFERGATE_STUB_NICE:-}" ] && [ -n "${BASH_EXECUTION_STRING:-}" ]; then
  _infergate_model=""
  _infergate_after=""
  for _infergate_word in $BASH_EXECUTION_STRING; do
    if [ -n "$_infergate_after" ]; then
      _infergate_model=$_infergate_word
      break
    fi
    case $_infergate_word in */triton_python_backend_stub) _infergate_after=1 ;; esac
  done
  if [ -r "$_infergate_model" ] && [[ $(< "$_infergate_model") == *INFERGATE_STUB_NICE* ]]
  then
    read -r _infergate_stat < "/proc/$$/stat"
    _infergate_fields=(${_infergate_stat##*) })  # from field 3 (state) on: 19 (nice) is [16]
    _infergate_nice=$(( _infergate_fields[16] + INFERGATE_STUB_NICE ))
    renice -n $(( _infergate_nice > 19 ? 19 : _infergate_nice )) -p $$ > /dev/null 2>&1
  fi
  unset _infergate_model _infergate_after _infergate_word _infergate_stat \
    _infergate_fields _infergate_nice
fi
