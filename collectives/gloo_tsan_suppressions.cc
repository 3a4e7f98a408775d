// Linked into the Gloo tests. Debian's libgloo is not built with ThreadSanitizer: a Gloo unbound
// buffer's destructor waits until the I/O thread dropped its references by spinning on a
// shared_ptr use count (gloo/common/memory.h, ShareableNonOwningPtr), which TSan cannot see, so
// it reports the destruction of the buffer (its condition variables, its memory) as racing with
// the I/O thread's last use of it in signalException (e.g. a peer closing its connection while
// this rank destroys its abort inbox). Only races with those two Gloo frames are suppressed.
extern "C" const char* __tsan_default_suppressions() {
  return "race:gloo::transport::tcp::UnboundBuffer::~UnboundBuffer\n"
         "race:gloo::transport::tcp::UnboundBuffer::signalException\n";
}
