// A structured push consumer for any OMG Notification Service channel (omniORB C++, standard COS stubs only).
//
//   ./consumer [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--timeout S] [-ORB...]
//
// Resolves the factory like the supplier, uses channel --channel (or creates one), connects a structured push
// consumer servant to a proxy of the default consumer admin and prints "ready channel=ID". Then it prints one
// "received ..." line per event and exits 0 after --count events (0: run until killed), or 1 when --timeout
// seconds pass first. The channel calls this process back, so its ORB listens: on 127.0.0.1 unless an
// -ORBendPoint is given (for a node on another host, e.g. -ORBendPoint giop:tcp:myhost.example:).
//
// Build (Debian: apt-get install libomniorb4-dev libcos4-dev g++):
//   g++ -o consumer consumer.cc -I/usr/include/COS -lCOS4 -lomniORB4 -lomniDynamic4 -lomnithread
#include "common.hh"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <CosNotifyComm.hh>

// Prints every event. The ORB calls it on its own threads: only print and count here.
class Printer : public POA_CosNotifyComm::StructuredPushConsumer {
 public:
  void push_structured_event(const CosNotification::StructuredEvent& ev) override {
    std::string line = example::describe(ev);
    std::lock_guard<std::mutex> lock(mutex_);
    std::cout << "received " << line << std::endl;
    ++received_;
    changed_.notify_all();
  }
  void offer_change(const CosNotification::EventTypeSeq&, const CosNotification::EventTypeSeq&) override {
    // the event types suppliers offer changed; this consumer takes everything
  }
  void disconnect_structured_push_consumer() override {
    std::lock_guard<std::mutex> lock(mutex_);
    disconnected_ = true;
    changed_.notify_all();
  }
  // true once `count` events arrived (count 0: never returns true); false on timeout or when disconnected
  bool wait(long count, double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::unique_lock<std::mutex> lock(mutex_);
    bool done = changed_.wait_until(lock, deadline, [&] { return disconnected_ || (count > 0 && received_ >= count); });
    return done && !disconnected_;
  }
  long received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  bool disconnected() {
    std::lock_guard<std::mutex> lock(mutex_);
    return disconnected_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  long received_ = 0;
  bool disconnected_ = false;
};

int main(int argc, char** argv) {
  const char* orb_options[][2] = {{"clientCallTimeOutPeriod", "30000"},
                                  {"endPoint", "giop:tcp:127.0.0.1:"},  // loopback by default: the node calls us
                                  {0, 0}};
  if (example::has_endpoint(argc, argv)) orb_options[1][0] = 0;        // the command line names the endpoint
  CORBA::ORB_var orb = CORBA::ORB_init(argc, argv, "omniORB4", orb_options);
  int rc = 1;
  try {
    example::Options opt = example::parse(argc, argv);
    CORBA::Object_var poa_obj = orb->resolve_initial_references("RootPOA");
    PortableServer::POA_var poa = PortableServer::POA::_narrow(poa_obj);
    PortableServer::POAManager_var manager = poa->the_POAManager();
    manager->activate();

    CosNotifyChannelAdmin::EventChannelFactory_var factory = example::resolve_factory(orb, opt);
    CosNotifyChannelAdmin::ChannelID cid;
    CosNotifyChannelAdmin::EventChannel_var channel = example::open_channel(factory, opt.channel, cid);
    CosNotifyChannelAdmin::ConsumerAdmin_var admin = channel->default_consumer_admin();
    CosNotifyChannelAdmin::ProxyID proxy_id;
    CosNotifyChannelAdmin::ProxySupplier_var any_proxy =
        admin->obtain_notification_push_supplier(CosNotifyChannelAdmin::STRUCTURED_EVENT, proxy_id);
    CosNotifyChannelAdmin::StructuredProxyPushSupplier_var proxy =
        CosNotifyChannelAdmin::StructuredProxyPushSupplier::_narrow(any_proxy);

    Printer* printer = new Printer;
    PortableServer::ObjectId_var oid = poa->activate_object(printer);
    printer->_remove_ref();  // the POA holds it now
    CORBA::Object_var printer_obj = poa->id_to_reference(oid);
    CosNotifyComm::StructuredPushConsumer_var printer_ref = CosNotifyComm::StructuredPushConsumer::_narrow(printer_obj);
    proxy->connect_structured_push_consumer(printer_ref);
    std::cout << "ready channel=" << cid << std::endl;

    bool complete = printer->wait(opt.count, opt.count > 0 ? opt.timeout : 1e9);
    if (!printer->disconnected()) proxy->disconnect_structured_push_supplier();
    std::cout << "done: received " << printer->received() << " of " << opt.count << std::endl;
    rc = complete ? 0 : 1;
  } catch (const CosNotifyChannelAdmin::ChannelNotFound&) {
    std::cerr << "consumer: that channel does not exist" << std::endl;
  } catch (const CORBA::Exception& ex) {
    std::cerr << "consumer: CORBA error " << example::what(ex) << std::endl;
  } catch (const std::exception& ex) {
    std::cerr << "consumer: " << ex.what() << std::endl;
  }
  orb->destroy();
  return rc;
}
