// A structured push supplier for any OMG Notification Service channel (omniORB C++, standard COS stubs only).
//
//   ./supplier [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--text TEXT] [-ORB...]
//
// Resolves the CosNotifyChannelAdmin::EventChannelFactory from --factory (a corbaloc:: URL or an IOR; default
// corbaloc::127.0.0.1:2809/NotifyEventChannelFactory) or from a file holding an IOR (--factory-file), uses channel
// --channel (or creates one), connects a structured proxy push consumer of the default supplier admin and pushes
// --count events. Prints "channel ID", then one "pushed ..." line per event. Exit code 0 when all were pushed.
//
// Build (Debian: apt-get install libomniorb4-dev libcos4-dev g++):
//   g++ -o supplier supplier.cc -I/usr/include/COS -lCOS4 -lomniORB4 -lomniDynamic4 -lomnithread
#include "common.hh"

static CosNotification::StructuredEvent make_event(long seq, const std::string& text) {
  CosNotification::StructuredEvent ev;
  CosNotification::FixedEventHeader& fixed = ev.header.fixed_header;
  fixed.event_type.domain_name = CORBA::string_dup("nsjms.example");
  fixed.event_type.type_name = CORBA::string_dup("ExampleEvent");
  fixed.event_name = CORBA::string_dup(("example-" + std::to_string(seq)).c_str());
  ev.header.variable_header.length(1);
  ev.header.variable_header[0].name = CORBA::string_dup(CosNotification::Priority);
  ev.header.variable_header[0].value <<= static_cast<CORBA::Short>(0);
  ev.filterable_data.length(2);
  ev.filterable_data[0].name = CORBA::string_dup("seq");
  ev.filterable_data[0].value <<= static_cast<CORBA::Long>(seq);
  ev.filterable_data[1].name = CORBA::string_dup("text");
  ev.filterable_data[1].value <<= text.c_str();
  ev.remainder_of_body <<= (text + " #" + std::to_string(seq)).c_str();
  return ev;
}

int main(int argc, char** argv) {
  const char* orb_options[][2] = {{"clientCallTimeOutPeriod", "30000"}, {0, 0}};  // a bounded wait for every call
  CORBA::ORB_var orb = CORBA::ORB_init(argc, argv, "omniORB4", orb_options);    // takes the -ORB options out
  int rc = 1;
  try {
    example::Options opt = example::parse(argc, argv);
    CosNotifyChannelAdmin::EventChannelFactory_var factory = example::resolve_factory(orb, opt);
    CosNotifyChannelAdmin::ChannelID cid;
    CosNotifyChannelAdmin::EventChannel_var channel = example::open_channel(factory, opt.channel, cid);
    std::cout << "channel " << cid << std::endl;

    CosNotifyChannelAdmin::SupplierAdmin_var admin = channel->default_supplier_admin();
    CosNotifyChannelAdmin::ProxyID proxy_id;
    CosNotifyChannelAdmin::ProxyConsumer_var any_proxy =
        admin->obtain_notification_push_consumer(CosNotifyChannelAdmin::STRUCTURED_EVENT, proxy_id);
    CosNotifyChannelAdmin::StructuredProxyPushConsumer_var proxy =
        CosNotifyChannelAdmin::StructuredProxyPushConsumer::_narrow(any_proxy);
    // A nil supplier reference is allowed for a push supplier: the channel then never calls this process back
    // (no subscription_change, no disconnect_structured_push_supplier), so it needs no POA.
    proxy->connect_structured_push_supplier(CosNotifyComm::StructuredPushSupplier::_nil());
    for (long seq = 0; seq < opt.count; ++seq) {
      CosNotification::StructuredEvent ev = make_event(seq, opt.text);
      proxy->push_structured_event(ev);
      std::cout << "pushed " << example::describe(ev) << std::endl;
    }
    proxy->disconnect_structured_push_consumer();
    rc = 0;
  } catch (const CosNotifyChannelAdmin::ChannelNotFound&) {
    std::cerr << "supplier: that channel does not exist" << std::endl;
  } catch (const CORBA::Exception& ex) {
    std::cerr << "supplier: CORBA error " << example::what(ex) << std::endl;
  } catch (const std::exception& ex) {
    std::cerr << "supplier: " << ex.what() << std::endl;
  }
  orb->destroy();
  return rc;
}
