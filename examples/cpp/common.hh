// Shared by supplier.cc and consumer.cc: command line, factory resolution, event formatting.
// Standard OMG COS stubs only (omniORB's libCOS4); nothing specific to nsjms.
#ifndef NSJMS_EXAMPLE_COMMON_HH
#define NSJMS_EXAMPLE_COMMON_HH

#include <omniORB4/CORBA.h>
#include <CosNotifyChannelAdmin.hh>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace example {

const char* const DEFAULT_FACTORY = "corbaloc::127.0.0.1:2809/NotifyEventChannelFactory";

struct Options {
  std::string factory = DEFAULT_FACTORY;  // --factory: corbaloc URL or IOR
  std::string factory_file;               // --factory-file: file holding an IOR
  long channel = -1;                      // --channel: -1 creates a new channel
  long count = 10;                        // --count
  double timeout = 60.0;                  // --timeout (consumer)
  std::string text = "hello";             // --text (supplier)
};

// Parses what CORBA::ORB_init left in argv (it takes the -ORB options out).
inline Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
    std::string value = argv[++i];
    if (name == "--factory") o.factory = value;
    else if (name == "--factory-file") o.factory_file = value;
    else if (name == "--channel") o.channel = std::stol(value);
    else if (name == "--count") o.count = std::stol(value);
    else if (name == "--timeout") o.timeout = std::stod(value);
    else if (name == "--text") o.text = value;
    else throw std::invalid_argument("unknown option " + name);
  }
  return o;
}

// true when the command line already names an ORB endpoint
inline bool has_endpoint(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "-ORBendPoint") == 0) return true;
  return false;
}

inline CosNotifyChannelAdmin::EventChannelFactory_ptr resolve_factory(CORBA::ORB_ptr orb, const Options& o) {
  std::string ref = o.factory;
  if (!o.factory_file.empty()) {
    std::ifstream in(o.factory_file);
    if (!(in >> ref)) throw std::runtime_error("no IOR in " + o.factory_file);
  }
  CORBA::Object_var obj = orb->string_to_object(ref.c_str());
  CosNotifyChannelAdmin::EventChannelFactory_ptr factory = CosNotifyChannelAdmin::EventChannelFactory::_narrow(obj);
  if (CORBA::is_nil(factory)) throw std::runtime_error(ref + " is not a CosNotifyChannelAdmin::EventChannelFactory");
  return factory;
}

// The channel named by --channel, or a new one with default QoS and admin properties.
inline CosNotifyChannelAdmin::EventChannel_ptr open_channel(CosNotifyChannelAdmin::EventChannelFactory_ptr factory,
                                                            long wanted, CosNotifyChannelAdmin::ChannelID& id) {
  if (wanted >= 0) {
    id = static_cast<CosNotifyChannelAdmin::ChannelID>(wanted);
    return factory->get_event_channel(id);
  }
  CosNotification::QoSProperties qos;
  CosNotification::AdminProperties admin;
  return factory->create_channel(qos, admin, id);
}

// One line per event; supplier and consumer print the same line for the same event.
inline std::string describe(const CosNotification::StructuredEvent& ev) {
  const CosNotification::FixedEventHeader& fixed = ev.header.fixed_header;
  std::string seq = "None", text = "None", body;
  for (CORBA::ULong i = 0; i < ev.filterable_data.length(); ++i) {
    const CosNotification::Property& p = ev.filterable_data[i];
    CORBA::Long n;
    const char* s;
    if (std::strcmp(p.name, "seq") == 0 && (p.value >>= n)) seq = std::to_string(n);
    else if (std::strcmp(p.name, "text") == 0 && (p.value >>= s)) text = s;
  }
  const char* b;
  if (ev.remainder_of_body >>= b) body = b;
  std::ostringstream out;
  out << fixed.event_name.in() << ' ' << fixed.event_type.domain_name.in() << '/'
      << fixed.event_type.type_name.in() << " seq=" << seq << " text=" << text << " body=" << body;
  return out.str();
}

// A CORBA exception's repository id and, for system exceptions, the minor code.
inline std::string what(const CORBA::Exception& ex) {
  std::ostringstream out;
  out << ex._rep_id();
  if (const CORBA::SystemException* sys = CORBA::SystemException::_downcast(&ex))
    out << " minor=0x" << std::hex << sys->minor();
  return out.str();
}

}  // namespace example

#endif
