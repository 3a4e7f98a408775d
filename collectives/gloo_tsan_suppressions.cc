// Linked into the Gloo tests. Debian's libgloo is not built with ThreadSanitizer: a Gloo unbound
// buffer's destructor waits until the I/O thread dropped its references by spinning on a
// shared_ptr use count (gloo/common/memory.h, ShareableNonOwningPtr), which TSan cannot see, so
// it reports the destruction of the buffer (its condition variables, its memory) as racing with
// the I/O thread's last use of it in signalException (e.g. a peer closing its connection while
// this rank destroys its abort inbox), or with its last use in handleRecvCompletion (a peer's
// failure notice arriving in the abort inbox of a rank whose communicator is being destroyed,
// as when a rank leaves while its peers' started calls fail). Only races with those Gloo frames
// are suppressed.
extern "C" const char* __tsan_default_suppressions() {
  return "race:gloo::transport::tcp::UnboundBuffer::~UnboundBuffer\n"
         "race:gloo::transport::tcp::UnboundBuffer::signalException\n"
         "race:gloo::transport::tcp::UnboundBuffer::handleRecvCompletion\n";
}
